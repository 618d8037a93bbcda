# images/egress-test/check.sh: run by scripts/build-image inside the built image (chroot,
# uid 1000, only PATH, HOME=/tmp and LANG set, sh -eu): pip and npm run, and trust the test
# CA; node and Python send to the proxy that HTTPS_PROXY names (offline: the "proxy" is a
# closed port, so the error must be a refused connection to it, not a failed DNS lookup).
CA=/usr/lib/ssl/cert.pem
CA_CN="plimsoll egress test CA"

python3 -m pip --version
pip --version
test "$(python3 -m pip config --global get global.cert)" = "$CA"
npm --version
test "$(npm config get cafile)" = "$CA"
test "$(npm config get update-notifier)" = false

# Python's ssl default store (OpenSSL's default cafile) holds the test CA, and only it.
python3 - "$CA_CN" <<'PY'
import ssl, sys
cas = ssl.create_default_context().get_ca_certs()
names = [dict(x[0] for x in c["subject"]).get("commonName") for c in cas]
assert names == [sys.argv[1]], names
print("python ssl default store:", names)
PY

# node: NODE_EXTRA_CA_CERTS adds the CA; NODE_USE_ENV_PROXY=1 sends fetch and https.get to
# the proxy (without it, both fail on the name: there is no DNS in the sandbox).
NODE_EXTRA_CA_CERTS=$CA node -e '
const tls = require("tls");
const extra = tls.getCACertificates("extra");
if (extra.length !== 1) throw new Error("NODE_EXTRA_CA_CERTS: " + extra.length + " certificates");
console.log("node", process.version, "extra CA certificates:", extra.length);
'
NODE_USE_ENV_PROXY=1 HTTPS_PROXY=http://127.0.0.1:1 node -e '
const https = require("https");
const url = "https://files.plimsoll.test:8443/hello.txt";
(async () => {
  const e = await fetch(url).then(() => null, (e) => e);
  const code = e && e.cause && e.cause.code;
  if (code !== "ECONNREFUSED") throw new Error("fetch did not go to the proxy: " + (code || e));
  const g = await new Promise((res) => https.get(url, () => res(null)).on("error", res));
  if (!g || g.code !== "ECONNREFUSED") throw new Error("https.get did not go to the proxy: " + (g && g.code));
  console.log("node: fetch and https.get went to HTTPS_PROXY");
})().catch((e) => { console.error(e); process.exit(1); });
'
HTTPS_PROXY=http://127.0.0.1:1 python3 - <<'PY'
import urllib.error, urllib.request
try:
    urllib.request.urlopen("https://files.plimsoll.test:8443/hello.txt", timeout=10)
    raise SystemExit("urllib: no error")
except urllib.error.URLError as e:
    assert isinstance(e.reason, ConnectionRefusedError), repr(e.reason)
print("python urllib: went to HTTPS_PROXY")
PY
