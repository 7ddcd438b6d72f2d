"""Python stubs of Envoy's rate limit service, built with grpcio-tools from Envoy's own .proto
files (those the envoy-types crate ships): every file rls.proto imports, transitively.

usage: envoy_stubs.py PROTO_ROOT OUT_DIR
PROTO_ROOT holds data-plane-api/, xds/, protoc-gen-validate/, googleapis/, ... (envoy-types'
proto/ folder). Writes the modules under OUT_DIR.
"""

import os
import re
import sys

from grpc_tools import protoc
import grpc_tools

SERVICE = "envoy/service/ratelimit/v3/rls.proto"
IMPORT = re.compile(r'^\s*import\s+(?:public\s+)?"([^"]+)";', re.MULTILINE)


def main(root, out):
    roots = [os.path.join(root, d) for d in sorted(os.listdir(root))]
    roots = [r for r in roots if os.path.isdir(r)]
    # Each package's protos may sit one level down (ratelimit/api, ...): search both.
    roots += [os.path.join(r, d) for r in list(roots) for d in sorted(os.listdir(r))
              if os.path.isdir(os.path.join(r, d)) and d in ("api",)]
    bundled = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")

    def find(name):
        for r in roots:
            if os.path.exists(os.path.join(r, name)):
                return r
        return None

    wanted, seen, used = [SERVICE], set(), set()
    while wanted:
        name = wanted.pop()
        if name in seen or name.startswith("google/protobuf/"):
            continue
        seen.add(name)
        r = find(name)
        if r is None:
            sys.exit(f"envoy_stubs: {name} is in none of {roots}")
        used.add(r)
        with open(os.path.join(r, name), encoding="utf-8") as f:
            wanted.extend(IMPORT.findall(f.read()))
    os.makedirs(out, exist_ok=True)
    args = ["protoc", f"-I{bundled}"] + [f"-I{r}" for r in sorted(used)]
    args += [f"--python_out={out}", f"--grpc_python_out={out}"] + sorted(seen)
    if protoc.main(args) != 0:
        sys.exit("envoy_stubs: protoc failed")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
