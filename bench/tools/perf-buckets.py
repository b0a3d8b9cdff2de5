#!/usr/bin/env python3
"""Where ingest's CPU goes, from a `perf record --call-graph dwarf` profile.

    target/release/ingest-bench --no-baseline --concurrency 16 --perf-record /tmp/ingest.perf
    perf script -i /tmp/ingest.perf | bench/tools/perf-buckets.py

Each sample is charged to the innermost frame of its call chain that matches
one of the buckets below (so allocator and kernel time land in the step that
caused them); samples matching none are split into kernel and user "glue".
Prints the share of samples per bucket.
"""
import collections
import re
import sys

# (bucket, regex over a frame's symbol), matched leaf-first, first hit wins.
BUCKETS = [
    ("HMAC-SHA256 signature check", r"runyard_forge::verify::github_signature"),
    ("normalize: JSON parse into serde_json::Value", r"runyard_forge::parse_json|serde_json::de::from_(trait|slice)"),
    ("normalize: dropping the Value tree", r"drop_in_place<serde_json::value::Value>"),
    ("normalize: mapping to JobObserved", r"runyard_forge::github::"),
    ("raw delivery headers (raw_message)", r"runyard_bus::raw::raw_message"),
    ("event encoding (event_message)", r"runyard_bus::Bus::event_message"),
    ("publish: Bus::publish, async-nats send, ack futures",
     r"runyard_bus::Bus::publish|async_nats::jetstream::context::PublishAckFuture|async_nats::jetstream::context::Context::send_publish"),
    ("NATS connection task: socket writes/reads, ack dispatch",
     r"async_nats::ConnectionHandler|async_nats::connection::Connection"),
    ("metrics, log line, response (finish)", r"runyard_ingest::routes::finish|runyard_ingest::metrics"),
    ("HTTP request read + parse (hyper)",
     r"hyper::proto::h1::conn::Conn<.*>::poll_read|hyper::proto::h1::io::Buffered<.*>::parse|poll_read_from_io"),
    ("HTTP response write (hyper flush: writev)",
     r"hyper::proto::h1::io::Buffered<.*>::poll_flush|hyper::proto::h1::conn::Conn<.*>::poll_flush|write_head|encode_head"),
    ("HTTP body collection (read_body)", r"http_body_util::|runyard_ingest::routes::read_body"),
    ("tokio: parking (epoll_wait, futex sleep)", r"park_internal|park_timeout|Driver::turn|Parker::park"),
    ("tokio: waking tasks/threads", r"Unparker::unpark|Waker::wake|schedule_task|Handle::notify|wake_by_val|wake_by_ref"),
]
COMPILED = [(name, re.compile(rx)) for name, rx in BUCKETS]


def samples(lines):
    """Yields (header, frames) per sample of `perf script` output."""
    head, frames = None, []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if head is not None:
                yield head, frames
            head, frames = None, []
        elif not line[0].isspace():
            head, frames = line, []
        else:
            frames.append(line.strip())
    if head is not None:
        yield head, frames


def bucket_of(frames):
    for frame in frames:
        for name, rx in COMPILED:
            if rx.search(frame):
                return name
    leaf = frames[0] if frames else ""
    if "[kernel.kallsyms]" in leaf:
        return "other: kernel (scheduler, interrupts)"
    return "other: user (tokio/hyper/axum/tower glue, header maps, allocator)"


def main():
    counts = collections.Counter()
    for _, frames in samples(sys.stdin):
        counts[bucket_of(frames)] += 1
    total = sum(counts.values())
    if total == 0:
        sys.exit("no samples on stdin (pipe `perf script -i FILE` in)")
    print(f"| share of ingest CPU | where ({total} samples) |")
    print("|---:|---|")
    for name, n in counts.most_common():
        print(f"| {100 * n / total:.1f}% | {name} |")


if __name__ == "__main__":
    main()
