import json,sys,glob,statistics,collections
# usage: abcmp.py DIR nameA nameB
d,a,b=sys.argv[1:4]
def load(name):
    rows=collections.defaultdict(list); pk=collections.defaultdict(list)
    for f in sorted(glob.glob(f"{d}/{name}-*.json")):
        j=json.load(open(f))
        for e in j.get("e2e") or []:
            rows[(e["method"],e["workers"],e["durability"])].append(e["tasks_per_s"])
        p=j.get("pickup")
        if p:
            for x in (p if isinstance(p,list) else [p]):
                key=x.get("durability","?")
                pk[key].append((x.get("p50_ms"),x.get("p99_ms")))
    return rows,pk
ra,pa=load(a); rb,pb=load(b)
for k in ra:
    ma=statistics.median(ra[k]); mb=statistics.median(rb.get(k,[0]))
    print(f"{k!s:40} {a} {ma:8.0f}  {b} {mb:8.0f}  ratio {mb/ma:5.2f}")
for k in pa:
    print("pickup",k,a,pa[k],b,pb.get(k))
