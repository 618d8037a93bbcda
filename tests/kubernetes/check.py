"""Checks deploy/kubernetes offline, since no cluster runs on these machines.

1. Every object (each resource the kustomization lists, the ConfigMap its generator makes,
   and secrets.example.yaml) validates against the Kubernetes OpenAPI schemas of several
   releases, strictly (an unknown field is an error), with kubernetes-validate.
2. What a schema cannot see: the kustomization names only files that exist; selectors match
   their pods' labels; every port, volume, Secret, ConfigMap key and file path one object
   names is there in the object that has it; the router finds the nodes by the headless
   Service's DNS name; each settings file listens where the pod's port is and reads its
   callers where the Secret is mounted; the Containerfile copies what the settings point at.

Run by `make kubernetes` with build/pyenv (tests/python/requirements.txt).
"""

import pathlib
import sys
import tomllib

import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "kubernetes"
# The oldest release still served by the main cloud providers, a middle one, the newest.
VERSIONS = ["1.30.0", "1.33.0", "1.37.0"]

failures = []


def fail(msg):
    failures.append(msg)
    print(f"FAIL: {msg}", file=sys.stderr)


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def validate(obj, where):
    for v in VERSIONS:
        try:
            kubernetes_validate.validate(obj, v, strict=True)
        except kubernetes_validate.ValidationError as e:
            fail(f"{where}: {obj.get('kind')} {obj['metadata'].get('name')}: Kubernetes {v}: {e.message} at {list(e.path)}")
        except kubernetes_validate.SchemaNotFoundError as e:
            fail(f"{where}: no schema for {obj.get('apiVersion')} {obj.get('kind')} in Kubernetes {v}: {e}")


kust = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
allowed = {"apiVersion", "kind", "namespace", "labels", "resources", "configMapGenerator"}
if set(kust) - allowed:
    fail(f"kustomization.yaml: fields this check does not know: {sorted(set(kust) - allowed)}")
if (kust.get("apiVersion"), kust.get("kind")) != ("kustomize.config.k8s.io/v1beta1", "Kustomization"):
    fail("kustomization.yaml is not a kustomize.config.k8s.io/v1beta1 Kustomization")
namespace = kust["namespace"]

objects = []
for name in kust["resources"]:
    path = DEPLOY / name
    if not path.is_file():
        fail(f"kustomization.yaml names {name}, which does not exist")
        continue
    for obj in load_all(path):
        objects.append((name, obj))
settings = {}
for gen in kust["configMapGenerator"]:
    data = {}
    for name in gen["files"]:
        text = (DEPLOY / name).read_text()
        data[name] = text
        settings[name] = tomllib.loads(text)
    objects.append(("configMapGenerator", {"apiVersion": "v1", "kind": "ConfigMap",
                                           "metadata": {"name": gen["name"], "namespace": namespace},
                                           "data": data}))
secrets = load_all(DEPLOY / "secrets.example.yaml")
listed = {p.name for p in DEPLOY.iterdir()}
expected = set(kust["resources"]) | {f for g in kust["configMapGenerator"] for f in g["files"]} | {
    "kustomization.yaml", "secrets.example.yaml", "Containerfile"}
if listed != expected:
    fail(f"deploy/kubernetes holds files the kustomization does not account for, or lacks some: {sorted(listed ^ expected)}")

for where, obj in objects:
    validate(obj, where)
for obj in secrets:
    validate(obj, "secrets.example.yaml")

by_kind = {}
for _, obj in objects + [("secrets", s) for s in secrets]:
    by_kind.setdefault(obj["kind"], {})[obj["metadata"]["name"]] = obj

# Selectors select their own pods.
for kind in ("DaemonSet", "Deployment"):
    for name, o in by_kind.get(kind, {}).items():
        want = o["spec"]["selector"]["matchLabels"]
        have = o["spec"]["template"]["metadata"]["labels"]
        if any(have.get(k) != v for k, v in want.items()):
            fail(f"{kind} {name}: its selector {want} does not select its pods {have}")

pods = {n: o["spec"]["template"] for k in ("DaemonSet", "Deployment") for n, o in by_kind.get(k, {}).items()}
services = by_kind.get("Service", {})
for name, svc in services.items():
    sel = svc["spec"]["selector"]
    matched = [n for n, t in pods.items() if all(t["metadata"]["labels"].get(k) == v for k, v in sel.items())]
    if not matched:
        fail(f"Service {name} selects no pod")
    for n in matched:
        ports = {p["name"]: p["containerPort"] for c in pods[n]["spec"]["containers"] for p in c.get("ports", [])}
        for p in svc["spec"]["ports"]:
            if p["targetPort"] not in ports:
                fail(f"Service {name}: targetPort {p['targetPort']} is no port of {n}")

# Volumes: every mount has its volume; every ConfigMap, Secret and key named exists.
for n, t in pods.items():
    spec = t["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in spec["containers"]:
        for m in c.get("volumeMounts", []):
            v = volumes.get(m["name"])
            if v is None:
                fail(f"{n}: mount {m['name']} has no volume")
                continue
            if "configMap" in v:
                cm = by_kind.get("ConfigMap", {}).get(v["configMap"]["name"])
                if cm is None:
                    fail(f"{n}: no ConfigMap {v['configMap']['name']}")
                elif "subPath" in m and m["subPath"] not in cm["data"]:
                    fail(f"{n}: ConfigMap {v['configMap']['name']} has no key {m['subPath']}")
            if "secret" in v and v["secret"]["secretName"] not in by_kind.get("Secret", {}):
                fail(f"{n}: Secret {v['secret']['secretName']} is not among secrets.example.yaml's")

# Each daemon's settings agree with its pod: listen port, callers file, state under a volume.
for n in ("plimsolld", "plimsolld-kvm"):
    t = pods[n]
    c = t["spec"]["containers"][0]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    config_path = c["command"][c["command"].index("--config") + 1]
    m = mounts.get(config_path)
    if m is None:
        fail(f"{n}: --config {config_path} is not mounted")
        continue
    s = settings[m["subPath"]]
    port = int(s["daemon"]["listen"].rsplit(":", 1)[1])
    if port != c["ports"][0]["containerPort"]:
        fail(f"{n}: the settings listen on {port}, the pod's port is {c['ports'][0]['containerPort']}")
    for key, path in (("callers_file", s["daemon"]["callers_file"]), ("state_dir", s["state_dir"]),
                      ("[oci] state_root", s["oci"]["state_root"])):
        if not any(path == mp or path.startswith(mp.rstrip("/") + "/") for mp in mounts):
            fail(f"{n}: {key} {path} is under no mount of the pod")
    if s["daemon"].get("max_connections_per_peer", 64) < s["daemon"].get("max_connections", 512):
        fail(f"{n}: the router is one peer: max_connections_per_peer must be max_connections")
    kvm = "qemu" in s["providers"]
    if kvm != (n == "plimsolld-kvm"):
        fail(f"{n}: qemu is offered where /dev/kvm is {'not ' if kvm else ''}given")

# The router finds the nodes by the headless Service's name, on its port; its token and
# callers are the mounted Secrets.
router = pods["plimsoll-router"]["spec"]["containers"][0]
args = dict(a[2:].split("=", 1) for a in router["command"][1:])
headless = [s for s in services.values() if s["spec"].get("clusterIP") == "None"]
if len(headless) != 1:
    fail("there must be one headless Service, the nodes'")
else:
    h = headless[0]
    want = f"{h['metadata']['name']}.{namespace}.svc.cluster.local"
    if args.get("dns") != want:
        fail(f"the router resolves {args.get('dns')}, the nodes' Service is {want}")
    if int(args.get("node-port", 0)) != h["spec"]["ports"][0]["port"]:
        fail(f"the router's --node-port is not the nodes' Service port")
router_mounts = [m["mountPath"] for m in router["volumeMounts"]]
for key in ("callers", "token-file"):
    if not any(args[key].startswith(mp + "/") for mp in router_mounts):
        fail(f"the router's --{key} {args[key]} is under no mount")
if int(args["listen"].rsplit(":", 1)[1]) != router["ports"][0]["containerPort"]:
    fail("the router listens on another port than its pod's")

# The Containerfile copies what the settings point at.
containerfile = (DEPLOY / "Containerfile").read_text()
for name, s in settings.items():
    for path in [s["oci"]["image"]] + ([s["qemu"]["assets"]] if "qemu" in s else []):
        if not any(line.startswith("COPY ") and path.startswith(line.split()[-1]) for line in containerfile.splitlines()):
            fail(f"{name}: {path} is not copied into the image by the Containerfile")

if failures:
    print(f"deploy/kubernetes: {len(failures)} problem(s)", file=sys.stderr)
    sys.exit(1)
print(f"deploy/kubernetes: {len(objects) + len(secrets)} objects valid against Kubernetes {', '.join(VERSIONS)} (strict), and consistent")
