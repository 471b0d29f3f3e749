"""`make bench`: every benchmark, one after the other; the refresh latency last."""

from bench import conversion, memory, pipeline, refresh, sink, storage_write

if __name__ == "__main__":
    conversion.run()
    print()
    pipeline.run()
    print()
    storage_write.run()
    print()
    sink.run()
    print()
    memory.run()
    print()
    refresh.run()
