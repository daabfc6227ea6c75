"""`python -m pydsa {demo,soak,info,bench}`."""
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m pydsa {demo,soak,info,bench} [options]\n"
              "  demo   simulate a DeepSeek-V4-style serving loop on built-in data, checking every result\n"
              "  soak   the c128 loop and a c4 layer for as many steps as asked (a million on a GPU), every step\n"
              "         busy, every result checked against float64 where the ops run, memory judged for growth\n"
              "  info   library, ABI and CUDA details, and where the library was loaded from\n"
              "  bench  benchmark the planner and the kernels against their floors and baselines")
        return 0
    from .info import namesakes
    found = namesakes()  # PyPI's pydsa over this one's __init__.py still runs this file: say so, run nothing
    for problem in found:
        print(f"pydsa: {problem}", file=sys.stderr)
    if found:
        return 1
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from .demo_cli import main as run
    elif cmd == "soak":
        from .soak import main as run
    elif cmd == "info":
        from .info import main as run
    elif cmd == "bench":
        from .bench import main as run
    else:
        print(f"unknown command {cmd!r}; expected demo, soak, info or bench", file=sys.stderr)
        return 2
    return run(rest)


if __name__ == "__main__":
    sys.exit(main())
