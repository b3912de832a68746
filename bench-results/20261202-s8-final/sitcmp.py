import json,glob,statistics,collections,sys
d=sys.argv[1]
def load(name):
    rows=collections.defaultdict(list); st=collections.defaultdict(list); pk=collections.defaultdict(list); im=collections.defaultdict(list)
    for f in sorted(glob.glob(f"{d}/{name}-*.json")):
        j=json.load(open(f))
        for e in j.get("e2e") or []:
            k=(e["method"],e["workers"],e["durability"]); rows[k].append(e["tasks_per_s"]); st[k].append(e["statements_per_task"])
        for key in ("pickup_ms","pickup_normal_ms"):
            p=j.get(key)
            if p: pk[key].append((round(p["p50"],3),round(p["p99"],3)))
        i=j.get("images")
        if i:
            big=[e for e in i["e2e"] if e["tasks"]<1000]
            for e in big: im[e["method"]].append(e["tasks_per_s"])
            phys=statistics.mean(i["physical_per_s"]); im["physical"].append(phys)
            con=[e["tasks_per_s"] for e in big if e["method"]=="concurrent"]
            if con: im["ratio"].append(con[0]/phys)
    return rows,st,pk,im
A=load("base"); B=load("new")
for k in A[0]:
    ma=statistics.median(A[0][k]); mb=statistics.median(B[0][k])
    print(f"{k!s:36} base {ma:7.0f} {[round(x) for x in A[0][k]]}  new {mb:7.0f} {[round(x) for x in B[0][k]]}  ratio {mb/ma:5.2f}  stmts {statistics.median(A[1][k]):.1f}->{statistics.median(B[1][k]):.1f}")
for k in A[2]: print("pickup",k,"base",A[2][k],"new",B[2][k])
for k in A[3]: print("images",k,"base",[round(x,3) for x in A[3][k]],"new",[round(x,3) for x in B[3][k]])
