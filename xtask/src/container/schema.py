# Checks Kubernetes manifests against the API's schema as python3-kubernetes
# (Debian's) generates its models from it: every object's kind is known,
# every field is one of its model's, required fields are there and values
# have their types.  Usage: schema.py FILE...; prints one line per object.
import sys

import kubernetes.client as k8s
import yaml
from kubernetes.client import ApiClient

client = ApiClient()
PRIMITIVE = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}


def walk(model, value, path, errors):
    """Unknown fields and wrong types, below a value of type `model`."""
    if model.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: a list expected")
            return
        for i, v in enumerate(value):
            walk(model[5:-1], v, f"{path}[{i}]", errors)
        return
    if model.startswith("dict("):
        inner = model[5:-1].split(", ", 1)[1]
        if not isinstance(value, dict):
            errors.append(f"{path}: a map expected")
            return
        for k, v in value.items():
            walk(inner, v, f"{path}.{k}", errors)
        return
    if model in PRIMITIVE:
        if not isinstance(value, PRIMITIVE[model]) or (model == "int" and isinstance(value, bool)):
            errors.append(f"{path}: {model} expected, not {value!r}")
        return
    cls = getattr(k8s, model, None)
    if cls is None or not hasattr(cls, "attribute_map"):
        return  # IntOrString and the like: any scalar
    if not isinstance(value, dict):
        errors.append(f"{path}: an object ({model}) expected")
        return
    by_json = {j: a for a, j in cls.attribute_map.items()}
    for key, v in value.items():
        attr = by_json.get(key)
        if attr is None:
            errors.append(f"{path}.{key}: no such field in {model}")
            continue
        walk(cls.openapi_types[attr], v, f"{path}.{key}", errors)


def main():
    errors = []
    for name in sys.argv[1:]:
        for doc in yaml.safe_load_all(open(name)):
            if not doc:
                continue
            group, _, version = doc["apiVersion"].rpartition("/")
            group = group.split(".")[0].capitalize() if group else ""
            model = f"V1{doc['kind']}" if version == "v1" else f"{version.capitalize()}{doc['kind']}"
            if not hasattr(k8s, model):
                errors.append(f"{name}: {doc['apiVersion']} {doc['kind']}: not in the Kubernetes API")
                continue
            before = len(errors)
            walk(model, doc, f"{name}:{doc['kind']}/{doc['metadata']['name']}", errors)
            try:
                # Required fields and enums, as the client's models check them.
                client._ApiClient__deserialize(doc, model)
            except (ValueError, TypeError) as e:
                errors.append(f"{name}: {doc['kind']}/{doc['metadata']['name']}: {e}")
            ok = "valid" if len(errors) == before else "INVALID"
            print(f"schema: {doc['kind']}/{doc['metadata']['name']} ({doc['apiVersion']}): {ok}")
    for e in errors:
        print(e, file=sys.stderr)
    sys.exit(1 if errors else 0)


main()
