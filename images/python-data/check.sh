# images/python-data/check.sh: run by scripts/build-image inside the built image (chroot,
# uid 1000, only PATH, HOME=/tmp and LANG set, sh -eu): pandas reads a CSV and describes it,
# matplotlib saves a PNG headless, the wheel imports, node requires the npm package.
cd /tmp
cat > rain.csv <<'CSV'
city,month,rain_mm,days
Bergen,1,190.2,20
Bergen,7,140.8,16
Lisbon,1,99.9,12
Lisbon,7,3.5,1
Oslo,1,49.1,11
Oslo,7,81.2,12
CSV
python3 - <<'PY'
import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from tabulate import tabulate

df = pd.read_csv("/tmp/rain.csv")
print(df.describe())
assert matplotlib.get_backend().lower() == "agg", matplotlib.get_backend()
fig, ax = plt.subplots(figsize=(4, 3))
df.pivot(index="month", columns="city", values="rain_mm").plot.bar(ax=ax)
fig.savefig("/tmp/rain.png", dpi=50)
with open("/tmp/rain.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n", "not a PNG"
print(tabulate(df.groupby("city").rain_mm.sum().reset_index(), headers="keys"))
print("numpy", np.__version__, "pandas", pd.__version__, "matplotlib", matplotlib.__version__)
PY
cd /work
node -e 'const _ = require("lodash"); const s = _.sum([1, 2, 3]); if (s !== 6) throw new Error(String(s)); console.log("lodash", _.VERSION)'
