"""Running a test body on several threads at once (no TensorFlow: the GPU engine tests use it too)."""
import threading


def run_threads(fn, args) -> None:
    """``fn(arg)`` for each of `args`, each on its own thread, all at once; the first failure is raised."""
    errors = []

    def target(arg):
        try:
            fn(arg)
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
