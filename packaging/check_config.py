"""Check the packaged /etc/hetpatrol/hetpatrol.yaml (run by debian/rules).

debian/rules rewrites four lines of config/hetpatrol.yaml with sed; a line that moved or
changed form would silently keep the per-user default. This reads the result back and
exits non-zero, naming the key, unless each one holds the node install's value.
"""

import sys

import yaml

WANT = {
    ("jsonl", "path"): "/var/log/hetpatrol/patrol.jsonl",
    ("jsonl", "max_bytes"): 0,
    ("state_path",): "/var/lib/hetpatrol/state.json",
    ("slurm", "scontrol"): ["/usr/bin/hetpatrol-scontrol"],
}

with open(sys.argv[1]) as f:
    doc = yaml.safe_load(f)
bad = []
for keys, want in WANT.items():
    value = doc
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    if value != want:
        bad.append(f"{'.'.join(keys)} is {value!r}, want {want!r}")
if bad:
    sys.exit(f"{sys.argv[1]}: " + "; ".join(bad))
print(f"{sys.argv[1]}: node install paths set")
