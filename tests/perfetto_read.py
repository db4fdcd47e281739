"""Reads a Perfetto trace with the classes of PyPI's perfetto package
(perfetto_trace_pb2, Perfetto's own protos) and prints what it holds as JSON,
every interned id resolved, for tests/it/timeline.rs.

    perfetto_read.py FILE

What the trace processor needs of a trace is checked on the way, and a trace
that breaks it fails with a message: every packet is on one sequence whose
first packet clears the incremental state before any packet needs it, every
interned id is defined before it is used, every event is on a track a
descriptor defines (thread tracks inside their process's), slice begins and
ends pair up on each thread track with no overlap, each flow starts at one
event and ends at a later one.
Printed:
{"threads": [{"uuid", "pid", "tid", "name", "process"}],
 "slices": [{"tid", "ts", "dur", "name", "category", "stack": [frames,
   outermost first], "args": {name: value}, "flows_in": [flow ids]}],
 "instants": [{"track": tid or "interrupts", "ts", "name", "category",
   "stack", "flows_out": [flow ids]}],
 "clocks": {id: timestamp}}
"""

import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


class Broken(Exception):
    pass


def main(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    tracks = {}  # uuid -> ("process"|"thread"|"other", descriptor)
    processes = {}
    interned = {k: {} for k in ("names", "cats", "notes", "funcs", "paths", "frames", "stacks")}
    cleared = False
    sequence = None
    open_slices = {}
    slices, instants = [], []
    flow_started = {}
    flow_ended = set()
    clocks = {}
    last_end = {}
    events = []

    def resolve(kind, iid):
        table = interned[kind]
        if iid not in table:
            raise Broken(f"{kind} id {iid} used before it is defined")
        return table[iid]

    for p in trace.packet:
        if not p.HasField("trusted_packet_sequence_id"):
            raise Broken("a packet without a sequence id")
        if sequence is None:
            sequence = p.trusted_packet_sequence_id
        elif p.trusted_packet_sequence_id != sequence:
            raise Broken("packets on two sequences")
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            cleared = True
        if p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE and not cleared:
            raise Broken("a packet needs incremental state before it was cleared")
        if p.HasField("clock_snapshot"):
            for c in p.clock_snapshot.clocks:
                clocks[c.clock_id] = c.timestamp
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.uuid in tracks:
                raise Broken(f"track {d.uuid} described twice")
            if d.HasField("thread"):
                if d.parent_uuid not in tracks or tracks[d.parent_uuid][0] != "process":
                    raise Broken(f"thread track {d.uuid} outside a process's")
                tracks[d.uuid] = ("thread", d)
            elif d.HasField("process"):
                tracks[d.uuid] = ("process", d)
                processes[d.uuid] = d.process
            else:
                tracks[d.uuid] = ("other", d)
        if p.HasField("interned_data"):
            if not cleared:
                raise Broken("interned data before the incremental state was cleared")
            i = p.interned_data
            for n in i.event_names:
                interned["names"][n.iid] = n.name
            for c in i.event_categories:
                interned["cats"][c.iid] = c.name
            for n in i.debug_annotation_names:
                interned["notes"][n.iid] = n.name
            for f in i.function_names:
                interned["funcs"][f.iid] = f.str.decode()
            for f in i.source_paths:
                interned["paths"][f.iid] = f.str.decode()
            for f in i.frames:
                name = resolve("funcs", f.function_name_id)
                if f.HasField("source_path_iid"):
                    name += f" ({resolve('paths', f.source_path_iid)}:{f.line_number})"
                interned["frames"][f.iid] = name
            for c in i.callstacks:
                interned["stacks"][c.iid] = [resolve("frames", x) for x in c.frame_ids]
        if p.HasField("track_event"):
            if not p.HasField("timestamp"):
                raise Broken("an event without a timestamp")
            if not p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE:
                raise Broken("an event with interned ids not marked as needing them")
            events.append(p)
    threads = []
    for uuid, (kind, d) in tracks.items():
        if kind == "thread":
            threads.append({
                "uuid": uuid,
                "pid": d.thread.pid,
                "tid": d.thread.tid,
                "name": d.thread.thread_name,
                "process": processes[d.parent_uuid].process_name,
            })
    tid_of = {t["uuid"]: t["tid"] for t in threads}
    # The trace processor sorts events by time: so does this reader (a
    # stable sort keeps the file's order of equal times).
    events.sort(key=lambda p: p.timestamp)
    for p in events:
        e = p.track_event
        if e.track_uuid not in tracks:
            raise Broken(f"an event on track {e.track_uuid}, which no descriptor defines")
        kind = tracks[e.track_uuid][0]
        name = resolve("names", e.name_iid) if e.HasField("name_iid") else None
        cats = [resolve("cats", c) for c in e.category_iids]
        stack = resolve("stacks", e.callstack_iid) if e.HasField("callstack_iid") else []
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            if kind != "thread":
                raise Broken("a slice on a track that is not a thread's")
            if e.track_uuid in open_slices:
                raise Broken(f"slices overlap on thread {tid_of[e.track_uuid]} at {p.timestamp}")
            if p.timestamp < last_end.get(e.track_uuid, 0):
                raise Broken("a slice begins before the last one on its track ended")
            args = {}
            for a in e.debug_annotations:
                key = resolve("notes", a.name_iid)
                args[key] = a.string_value if a.HasField("string_value") else a.uint_value
            open_slices[e.track_uuid] = {
                "tid": tid_of[e.track_uuid],
                "ts": p.timestamp,
                "name": name,
                "category": cats[0] if cats else None,
                "stack": stack,
                "args": args,
                "flows_in": [],
            }
        elif e.type == pb.TrackEvent.TYPE_SLICE_END:
            s = open_slices.pop(e.track_uuid, None)
            if s is None:
                raise Broken(f"a slice end without its begin on track {e.track_uuid}")
            s["dur"] = p.timestamp - s["ts"]
            last_end[e.track_uuid] = p.timestamp
            for f in e.terminating_flow_ids:
                if f not in flow_started:
                    raise Broken(f"flow {f} ends before it starts")
                if f in flow_ended:
                    raise Broken(f"flow {f} ends twice")
                flow_ended.add(f)
                s["flows_in"].append(f)
            slices.append(s)
        elif e.type == pb.TrackEvent.TYPE_INSTANT:
            for f in e.flow_ids:
                if f in flow_started:
                    raise Broken(f"flow {f} starts twice")
                flow_started[f] = p.timestamp
            instants.append({
                "track": tid_of.get(e.track_uuid, "interrupts" if kind == "other" else None),
                "ts": p.timestamp,
                "name": name,
                "category": cats[0] if cats else None,
                "stack": stack,
                "flows_out": list(e.flow_ids),
            })
        else:
            raise Broken(f"an event of type {e.type}")
    if open_slices:
        raise Broken(f"{len(open_slices)} slices never end")
    json.dump({
        "threads": threads,
        "slices": slices,
        "instants": instants,
        "clocks": {str(k): v for k, v in clocks.items()},
    }, sys.stdout)


if __name__ == "__main__":
    try:
        main(sys.argv[1])
    except Broken as e:
        print(f"perfetto_read.py: {sys.argv[1]}: {e}", file=sys.stderr)
        sys.exit(1)
