"""The server as of HEAD (before this session's change): /tmp/base first on the path."""
import sys
if __name__ == "__main__":
    sys.path.insert(0, "/tmp/base")
    import specserve
    assert specserve.__file__.startswith("/tmp/base"), specserve.__file__
    from specserve.cli import main
    sys.argv = ["specserve", "serve"] + sys.argv[1:]
    main()
