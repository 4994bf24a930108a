#!/usr/bin/env python3
"""Render a kustomization offline, without kubectl: the small subset tandem uses.

Supported kustomization fields:
  resources          files, or directories holding a kustomization.yaml (recursively)
  namespace          set on every namespaced resource (not on Namespace and other
                     cluster-scoped kinds)
  commonLabels       metadata.labels, selectors and pod template labels of the kinds below
  labels             [{pairs, includeSelectors, includeTemplates}]
  images             [{name, newName, newTag, digest}] matched on the image name
  patches            [{path}] strategic-merge patches naming their target by
                     apiVersion/kind/metadata.name
  patchesStrategicMerge  [path] (the deprecated spelling of the same)

Strategic merge: maps merge recursively; `key: null` deletes the key; lists of maps with
a known merge key (containers/initContainers/env/volumes by name, volumeMounts by
mountPath, container ports by containerPort, service ports by port) merge item by item,
and an item with `$patch: delete` removes the matching item; `$patch: replace` in a map
replaces it whole; any other list is replaced.

Anything else in a kustomization is an error, so the renderer never silently differs from
kustomize. Output: the rendered resources as one multi-document YAML stream on stdout
(or --out FILE). Needs PyYAML.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import Any

import yaml

SUPPORTED = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "commonLabels",
    "labels",
    "images",
    "patches",
    "patchesStrategicMerge",
}

CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "PersistentVolume",
    "StorageClass",
    "PriorityClass",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}

# kind -> paths (lists of keys) of selector maps and pod-template label maps.
SELECTOR_PATHS = {
    "Deployment": [["spec", "selector", "matchLabels"]],
    "StatefulSet": [["spec", "selector", "matchLabels"]],
    "DaemonSet": [["spec", "selector", "matchLabels"]],
    "ReplicaSet": [["spec", "selector", "matchLabels"]],
    "PodDisruptionBudget": [["spec", "selector", "matchLabels"]],
    "Service": [["spec", "selector"]],
}
TEMPLATE_PATHS = {
    "Deployment": [["spec", "template", "metadata", "labels"]],
    "StatefulSet": [["spec", "template", "metadata", "labels"]],
    "DaemonSet": [["spec", "template", "metadata", "labels"]],
    "ReplicaSet": [["spec", "template", "metadata", "labels"]],
    "Job": [["spec", "template", "metadata", "labels"]],
    "CronJob": [["spec", "jobTemplate", "spec", "template", "metadata", "labels"]],
}

MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "imagePullSecrets": "name",
}


class RenderError(Exception):
    """A kustomization this renderer cannot render faithfully."""


def load_docs(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def kustomization_file(directory: str) -> str:
    for name in ("kustomization.yaml", "kustomization.yml", "Kustomization"):
        p = os.path.join(directory, name)
        if os.path.isfile(p):
            return p
    raise RenderError(f"no kustomization.yaml in {directory}")


def merge_key_for(field: str, items: list) -> str | None:
    if field in MERGE_KEYS:
        return MERGE_KEYS[field]
    if field == "ports" and items and all(isinstance(i, dict) for i in items):
        if all("containerPort" in i for i in items):
            return "containerPort"
        if all("port" in i for i in items):
            return "port"
    return None


def smp(base: Any, patch: Any, field: str = "") -> Any:
    """Applies a strategic-merge patch `patch` to `base` (returns a new value)."""
    if isinstance(patch, dict):
        if patch.get("$patch") == "replace":
            return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
        if patch.get("$patch") == "delete":
            return None
        if not isinstance(base, dict):
            base = {}
        out = copy.deepcopy(base)
        for k, v in patch.items():
            if k.startswith("$"):
                if k.startswith("$setElementOrder") or k == "$retainKeys":
                    continue
                raise RenderError(f"unsupported strategic-merge directive {k}")
            if v is None:
                out.pop(k, None)
            elif k in out:
                merged = smp(out[k], v, k)
                if merged is None:
                    out.pop(k, None)
                else:
                    out[k] = merged
            else:
                out[k] = strip_directives(v)
        return out
    if isinstance(patch, list):
        key = merge_key_for(field, patch + (base if isinstance(base, list) else []))
        if key is None or not isinstance(base, list):
            return [strip_directives(i) for i in patch if not is_delete(i)]
        out = copy.deepcopy(base)
        for item in patch:
            if not isinstance(item, dict) or key not in item:
                raise RenderError(f"list item under {field} lacks merge key {key}: {item!r}")
            idx = next((i for i, b in enumerate(out) if b.get(key) == item[key]), None)
            if is_delete(item):
                if idx is not None:
                    del out[idx]
            elif idx is None:
                out.append(strip_directives(item))
            else:
                out[idx] = smp(out[idx], item, field)
        return out
    return copy.deepcopy(patch)


def is_delete(item: Any) -> bool:
    return isinstance(item, dict) and item.get("$patch") == "delete"


def strip_directives(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: strip_directives(x) for k, x in v.items() if not k.startswith("$") and x is not None}
    if isinstance(v, list):
        return [strip_directives(x) for x in v if not is_delete(x)]
    return copy.deepcopy(v)


def get_path(obj: dict, path: list[str], create: bool) -> dict | None:
    cur: Any = obj
    for k in path:
        if not isinstance(cur, dict):
            return None
        if k not in cur or cur[k] is None:
            if not create:
                return None
            cur[k] = {}
        cur = cur[k]
    return cur if isinstance(cur, dict) else None


def add_labels(res: dict, pairs: dict, selectors: bool, templates: bool) -> None:
    get_path(res, ["metadata", "labels"], True).update(pairs)
    kind = res.get("kind", "")
    if selectors:
        for p in SELECTOR_PATHS.get(kind, []):
            get_path(res, p, True).update(pairs)
    if selectors or templates:
        for p in TEMPLATE_PATHS.get(kind, []):
            get_path(res, p, True).update(pairs)


def pod_specs(res: dict) -> list[dict]:
    kind = res.get("kind")
    spec = res.get("spec") or {}
    if kind == "Pod":
        return [spec]
    if kind == "CronJob":
        return [((spec.get("jobTemplate") or {}).get("spec") or {}).get("template", {}).get("spec") or {}]
    tmpl = spec.get("template")
    return [tmpl.get("spec") or {}] if isinstance(tmpl, dict) else []


def split_image(image: str) -> tuple[str, str, str]:
    """name, tag (with ':'), digest (with '@')."""
    name, digest = (image.split("@", 1) + [""])[:2]
    digest = "@" + digest if digest else ""
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon:]
    return name, tag, digest


def set_images(res: dict, images: list[dict]) -> None:
    for spec in pod_specs(res):
        for field in ("initContainers", "containers"):
            for c in spec.get(field) or []:
                name, tag, digest = split_image(c.get("image", ""))
                for img in images:
                    if img.get("name") != name:
                        continue
                    new_name = img.get("newName", name)
                    if "digest" in img:
                        c["image"] = f"{new_name}@{img['digest']}"
                    elif "newTag" in img:
                        c["image"] = f"{new_name}:{img['newTag']}"
                    else:
                        c["image"] = f"{new_name}{tag}{digest}"


def res_id(res: dict) -> tuple[str, str, str]:
    group = res.get("apiVersion", "").split("/")[0] if "/" in res.get("apiVersion", "") else ""
    return (group, res.get("kind", ""), (res.get("metadata") or {}).get("name", ""))


def render(directory: str) -> list[dict]:
    kfile = kustomization_file(directory)
    docs = load_docs(kfile)
    if len(docs) != 1:
        raise RenderError(f"{kfile}: expected one document")
    k = docs[0]
    unknown = set(k) - SUPPORTED
    if unknown:
        raise RenderError(f"{kfile}: unsupported fields {sorted(unknown)}")

    out: list[dict] = []
    for r in k.get("resources") or []:
        p = os.path.normpath(os.path.join(directory, r))
        if os.path.isdir(p):
            out.extend(render(p))
        elif os.path.isfile(p):
            out.extend(load_docs(p))
        else:
            raise RenderError(f"{kfile}: resource {r} not found (remote resources unsupported)")

    seen = set()
    for res in out:
        rid = res_id(res)
        if rid in seen:
            raise RenderError(f"{kfile}: duplicate resource {rid}")
        seen.add(rid)

    patch_files = [p["path"] if isinstance(p, dict) else p for p in k.get("patches") or []]
    for p in k.get("patches") or []:
        if not isinstance(p, dict) or set(p) - {"path"}:
            raise RenderError(f"{kfile}: only `patches: - path: FILE` is supported, got {p!r}")
    patch_files += list(k.get("patchesStrategicMerge") or [])
    for pf in patch_files:
        for patch in load_docs(os.path.join(directory, pf)):
            pid = res_id(patch)
            idx = next((i for i, r in enumerate(out) if res_id(r) == pid), None)
            if idx is None:
                raise RenderError(f"{kfile}: patch {pf} targets {pid}, which is not a resource")
            out[idx] = smp(out[idx], patch)

    for lab in k.get("labels") or []:
        if set(lab) - {"pairs", "includeSelectors", "includeTemplates"}:
            raise RenderError(f"{kfile}: unsupported labels entry {lab!r}")
        for res in out:
            add_labels(res, lab.get("pairs") or {}, bool(lab.get("includeSelectors")),
                       bool(lab.get("includeTemplates")))
    if k.get("commonLabels"):
        for res in out:
            add_labels(res, k["commonLabels"], True, True)

    if k.get("images"):
        for img in k["images"]:
            if set(img) - {"name", "newName", "newTag", "digest"}:
                raise RenderError(f"{kfile}: unsupported images entry {img!r}")
        for res in out:
            set_images(res, k["images"])

    if k.get("namespace"):
        for res in out:
            if res.get("kind") not in CLUSTER_SCOPED:
                get_path(res, ["metadata"], True)["namespace"] = k["namespace"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", help="folder with a kustomization.yaml")
    ap.add_argument("--out", help="write here instead of stdout")
    args = ap.parse_args()
    try:
        docs = render(args.directory)
    except (RenderError, OSError, yaml.YAMLError) as e:
        print(f"render_kustomize: {e}", file=sys.stderr)
        return 1
    text = yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
