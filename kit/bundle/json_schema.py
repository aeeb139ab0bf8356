"""Publish the JSON Schemas of ``manifest.json`` and ``metrics.json``, generated from the models.

The committed files under ``kit/bundle/schemas/`` let tools that are not Python validate a
bundle; a test keeps them equal to what :func:`bundle_json_schemas` generates. After changing
:class:`~kit.bundle.schema.Manifest` or :class:`~kit.bundle.schema.MetricsFile`, regenerate
them with ``python -m kit.bundle.json_schema``.
"""

import json
from pathlib import Path
from typing import Any

from kit.bundle.schema import SCHEMA_VERSION, Manifest, MetricsFile

SCHEMAS_DIR = Path(__file__).resolve().parent / "schemas"
"""Where the committed schema files live."""

_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def bundle_json_schemas() -> dict[str, dict[str, Any]]:
    """Return file name -> JSON Schema for the bundle's two JSON files, this kit's version.

    The schemas carry what pydantic can express (types, required fields, enums, bounds, each
    field's description); cross-field rules (``error`` null when ``status`` is ok, a reason
    for a field without a source) are checked by the kit's reader only.
    """
    out = {}
    for name, model in (("manifest", Manifest), ("metrics", MetricsFile)):
        schema = model.model_json_schema(mode="validation")
        out[f"{name}.schema.json"] = {
            "$schema": _DIALECT,
            "$id": f"urn:charllm-kit:bundle:v{SCHEMA_VERSION}:{name}",
            **schema,
        }
    return out


def render(schema: dict[str, Any]) -> str:
    """Serialize one schema exactly as the committed files are written."""
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def write_json_schemas(directory: Path = SCHEMAS_DIR) -> list[Path]:
    """Write every schema of :func:`bundle_json_schemas` into ``directory``; return the paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, schema in bundle_json_schemas().items():
        path = directory / name
        path.write_text(render(schema), encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    for written in write_json_schemas():
        print(written)
