"""Reads OTLP profiles requests with the classes of PyPI's opentelemetry-proto
and prints them as JSON, every index resolved, for tests/it/otlp.rs.

    otlp_read.py FILE...   (a file may hold requests one after the other)

Each FILE is parsed as one ExportProfilesServiceRequest (protobuf merges
concatenated requests). What the profiles signal requires is checked on the
way, and a request that breaks it fails with a message: each dictionary
table starts with its zero value and holds no entry twice (so requests
written one after another must add to one dictionary), every index is
within its table, the
attribute keys of one list are distinct, each sample has one value.
Printed: a list, one entry per FILE:
{"resources": [{"attributes": {...}, "scope": NAME, "version": V,
  "profiles": [{"sample_type": "TYPE/UNIT", "time_unix_nano": N,
  "duration_nano": N, "samples": [{"attributes": {...}, "value": N,
  "frames": [{"name", "file", "line", "address", "type", "mapping",
  "build_id"}, ...]}]}]}]}
with frames outermost first (functions inlined at an address after the
one they were inlined into).
"""

import json
import sys

from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2


class Broken(Exception):
    pass


def at(table, index, what):
    if not 0 <= index < len(table):
        raise Broken(f"{what} index {index} outside its table of {len(table)}")
    return table[index]


def any_value(v):
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    raise Broken(f"an attribute's value is {kind}, not a string or an integer")


def attributes(d, indices, what):
    out = {}
    for i in indices:
        kv = at(d.attribute_table, i, f"{what} attribute")
        if i == 0:
            raise Broken(f"{what} refers to the zero attribute")
        key = at(d.string_table, kv.key_strindex, "attribute key")
        if key in out:
            raise Broken(f"{what}: attribute {key} twice")
        out[key] = any_value(kv.value)
    return out


def check_zero_values(d):
    zero = {
        "mapping_table": profiles_pb2.Mapping(),
        "location_table": profiles_pb2.Location(),
        "function_table": profiles_pb2.Function(),
        "attribute_table": profiles_pb2.KeyValueAndUnit(),
        "stack_table": profiles_pb2.Stack(),
    }
    for table, value in zero.items():
        entries = getattr(d, table)
        if not entries or entries[0] != value:
            raise Broken(f"{table}[0] is not the zero value")
    if not d.string_table or d.string_table[0] != "":
        raise Broken('string_table[0] is not ""')
    if not d.link_table or any(d.link_table[0].trace_id) or any(d.link_table[0].span_id):
        raise Broken("link_table[0] is not the zero link")


def check_no_duplicates(d):
    for table in (
        "mapping_table",
        "location_table",
        "function_table",
        "string_table",
        "attribute_table",
        "stack_table",
    ):
        seen = {}
        for i, e in enumerate(getattr(d, table)):
            key = e if isinstance(e, str) else e.SerializeToString(deterministic=True)
            if key in seen:
                raise Broken(f"{table}[{i}] is {table}[{seen[key]}] again")
            seen[key] = i


def frame_list(d, stack_index):
    stack = at(d.stack_table, stack_index, "stack")
    frames = []
    for li in stack.location_indices:
        loc = at(d.location_table, li, "location")
        if li == 0:
            raise Broken("a stack refers to the zero location")
        if not loc.lines:
            raise Broken(f"location {li} has no line")
        mapping = at(d.mapping_table, loc.mapping_index, "mapping")
        mattrs = attributes(d, mapping.attribute_indices, "mapping")
        lattrs = attributes(d, loc.attribute_indices, "location")
        names = []
        for line in loc.lines:
            f = at(d.function_table, line.function_index, "function")
            if line.function_index == 0:
                raise Broken("a line refers to the zero function")
            names.append(
                {
                    "name": at(d.string_table, f.name_strindex, "function name"),
                    "file": at(d.string_table, f.filename_strindex, "file name"),
                    "line": line.line,
                    "address": loc.address,
                    "type": lattrs.get("profile.frame.type"),
                    "mapping": at(d.string_table, mapping.filename_strindex, "mapping file")
                    if loc.mapping_index
                    else None,
                    "build_id": mattrs.get("process.executable.build_id.gnu"),
                }
            )
        # Lines: inlined first, the function they are in last.
        frames.extend(names)
    frames.reverse()
    return frames


def read(data):
    req = profiles_service_pb2.ExportProfilesServiceRequest()
    req.ParseFromString(data)
    d = req.dictionary
    check_zero_values(d)
    check_no_duplicates(d)
    resources = []
    for rp in req.resource_profiles:
        rattrs = {}
        for kv in rp.resource.attributes:
            if kv.key in rattrs:
                raise Broken(f"resource attribute {kv.key} twice")
            rattrs[kv.key] = any_value(kv.value)
        for sp in rp.scope_profiles:
            profiles = []
            for p in sp.profiles:
                st = p.sample_type
                samples = []
                for s in p.samples:
                    if len(s.values) != 1:
                        raise Broken(f"a sample with {len(s.values)} values")
                    samples.append(
                        {
                            "attributes": attributes(d, s.attribute_indices, "sample"),
                            "value": s.values[0],
                            "frames": frame_list(d, s.stack_index),
                        }
                    )
                profiles.append(
                    {
                        "sample_type": at(d.string_table, st.type_strindex, "type")
                        + "/"
                        + at(d.string_table, st.unit_strindex, "unit"),
                        "time_unix_nano": p.time_unix_nano,
                        "duration_nano": p.duration_nano,
                        "samples": samples,
                    }
                )
            resources.append(
                {
                    "attributes": rattrs,
                    "scope": sp.scope.name,
                    "version": sp.scope.version,
                    "profiles": profiles,
                }
            )
    return {"resources": resources}


def main():
    out = []
    for path in sys.argv[1:]:
        with open(path, "rb") as f:
            data = f.read()
        try:
            out.append(read(data))
        except Broken as e:
            sys.exit(f"{path}: {e}")
    json.dump(out, sys.stdout)


main()
