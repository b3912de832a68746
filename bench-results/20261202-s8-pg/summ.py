import json, sys, glob, statistics as st
tag = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f'/tmp/pg2/{tag}-*-*.json')):
    r, w = f.split('/')[-1][:-5].split('-')[-2:]
    try: d = json.load(open(f))
    except Exception as ex: print(f, 'bad', ex); continue
    e = d['postgres']['e2e']
    one, two = e[1], e[2]
    def disp(x):
        for s in (x.get('profile') or {}).get('stages', []):
            if s['stage'] == 'dispatch call': return s['calls_per_task']
    rows.setdefault(w, []).append(dict(
        r=r, sqlite=e[0]['tasks_per_s'], one=one['tasks_per_s'], two=two['tasks_per_s'], ratio=two['tasks_per_s']/one['tasks_per_s'],
        st1=one['statements_per_task'], st2=two['statements_per_task'],
        rt1=one.get('round_trips_per_task'), rt2=two.get('round_trips_per_task'),
        lw1=one['lock_wait_ms_per_task'], lw2=two['lock_wait_ms_per_task'],
        h2=two['hints_per_task'], d1=disp(one), d2=disp(two),
        idle=(d['postgres']['idle']['sql_statements'], d['postgres']['idle']['second_window_sql_statements'])))
for w in sorted(rows):
    print('==', w)
    for x in rows[w]:
        print(f"  round {x['r']}: sqlite {x['sqlite']:.0f}  1 node {x['one']:.0f}  2 nodes {x['two']:.0f}  ratio {x['ratio']:.2f}  stmts {x['st1']:.1f}/{x['st2']:.1f}  trips {x['rt1']}/{x['rt2']}  lockwait {x['lw1']:.3f}/{x['lw2']:.3f}  dispatch/t {x['d1']}/{x['d2']}  hints2 {x['h2']}  idle {x['idle']}")
    m = lambda k: st.median(x[k] for x in rows[w])
    print(f"  median: 1 node {m('one'):.0f}  2 nodes {m('two'):.0f}  ratio {m('ratio'):.2f} (ratio of medians {m('two')/m('one'):.2f})  sqlite {m('sqlite'):.0f}")
