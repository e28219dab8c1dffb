"""Render what `make deploy-infra` and `make deploy-volumes` apply, into build/.

python infra/render.py base --image ghcr.io/you/foxhunt-mlflow:<tag> --out build/infra
    a kustomize overlay of infra/base naming the MLflow image: the same registry and tag
    as `make images` and the pipelines (`kubectl apply -k build/infra`)
python infra/render.py volumes --namespace <profile> [--storage-class <rwx class>] --out D
    the two PVCs of infra/volumes in that namespace, of that class (`kubectl apply -f D`)
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import yaml

INFRA = Path(__file__).resolve().parent


def render_base(image: str, out: Path) -> Path:
    name, _, tag = image.rpartition(":")
    if not name or "/" in tag:
        raise SystemExit(f"--image {image!r}: expected <registry>/foxhunt-mlflow:<tag>")
    out.mkdir(parents=True, exist_ok=True)
    base = Path(os.path.relpath(INFRA / "base", out.resolve()))
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(base)],
        "images": [{"name": "foxhunt-mlflow", "newName": name, "newTag": tag}],
    }
    path = out / "kustomization.yaml"
    path.write_text("# Rendered by infra/render.py; do not edit.\n" + yaml.safe_dump(doc))
    return path


def render_volumes(namespace: str, storage_class: str, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for src in sorted((INFRA / "volumes").glob("pvc-*.yaml")):
        doc = yaml.safe_load(src.read_text())
        doc["metadata"]["namespace"] = namespace
        doc["metadata"].setdefault("labels", {})["app.kubernetes.io/part-of"] = "foxhunt"
        if storage_class:
            doc["spec"]["storageClassName"] = storage_class
        path = out / src.name
        path.write_text("# Rendered by infra/render.py; do not edit.\n" + yaml.safe_dump(doc))
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    b = sub.add_parser("base")
    b.add_argument("--image", required=True)
    b.add_argument("--out", type=Path, default=Path("build/infra"))
    v = sub.add_parser("volumes")
    v.add_argument("--namespace", required=True)
    v.add_argument("--storage-class", default="")
    v.add_argument("--out", type=Path, default=Path("build/infra-volumes"))
    args = ap.parse_args(argv)
    if args.what == "base":
        print(f"wrote {render_base(args.image, args.out)}")
    else:
        for p in render_volumes(args.namespace, args.storage_class, args.out):
            print(f"wrote {p}")


if __name__ == "__main__":
    main()
