"""`make bench`: every benchmark, one after the other; the refresh latency last."""

from bench import conversion, memory, merge, pipeline, refresh, sink

if __name__ == "__main__":
    conversion.run()
    print()
    pipeline.run()
    print()
    sink.run()
    print()
    memory.run()
    print()
    merge.run()
    print()
    refresh.run()
