"""`mcpctl models`: every configured model, its state and its tensors."""

from __future__ import annotations

import argparse
import json
from typing import Any

from mcpd.client import Client, ServerError
from mcpd.ctl.common import add_socket, connected


def _tensors(tensors: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{t['name']} {t['datatype']}[{','.join(str(d) for d in t['shape'])}]" for t in tensors
    )


@connected
def run(args: argparse.Namespace, client: Client) -> int:
    rows = []
    for entry in client.models():
        row = dict(entry)
        if entry["state"] == "READY":
            try:
                row["metadata"] = client.model_metadata(entry["name"])
            except ServerError as exc:  # unloaded between the two calls
                row["reason"] = exc.message
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no models configured ([[models]] in the config)")
    for row in rows:
        print(f"{row['name']}  {row['state']}" + (f"  {row['reason']}" if row["reason"] else ""))
        meta = row.get("metadata")
        if meta:
            print(f"  platform {meta['platform']}")
            print(f"  inputs   {_tensors(meta['inputs'])}")
            print(f"  outputs  {_tensors(meta['outputs'])}")
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("models", help="configured models, their state and tensors")
    add_socket(parser)
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(func=run)
