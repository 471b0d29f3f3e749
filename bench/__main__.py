"""`make bench`: every benchmark, one after the other."""

from bench import conversion

if __name__ == "__main__":
    conversion.run()
