"""What the entry scripts share: turning predictable mistakes into one-line messages."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

EXIT_USAGE = 2  # bad config, missing input: nothing was done
EXIT_CTRL_C = 130  # as a shell reports a process that SIGINT ended


def run_main(main: Callable[[list[str] | None], int]) -> None:
    """Call `main`; a user error becomes `error: ...` on stderr and exit code 2, not a traceback.

    Whatever way `main` ends, the process group it joined is destroyed before the interpreter exits.
    """
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    remember_ctrl_c()
    threading.excepthook = _thread_failed
    try:
        code = main(None)
        raise_if_interrupted()  # a Ctrl-C some library swallowed still ends the run as one
        sys.exit(code)
    except KeyboardInterrupt:  # Ctrl-C outside train's own handler: what was being written is a temporary
        _exit_interrupted()
    except (ValueError, OSError, KeyError) as e:  # OSError: a path that is a file, unwritable, a full disk
        if _ctrl_c_seen:  # raised while a Ctrl-C unwound a library (a half-closed writer): the Ctrl-C is the cause
            _exit_interrupted()
        if os.environ.get("PIPELINE_DEBUG"):
            raise
        _close_progress_bars()
        print(f"error: {_message(e)}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except Exception:
        if _ctrl_c_seen:
            _exit_interrupted()
        raise
    finally:
        end_process_group()


def _thread_failed(args: threading.ExceptHookArgs) -> None:
    """A library's background thread that dies (TensorBoard's event writer on a read-only folder) is one warning
    line, not a traceback after the run's own one-line error: the library re-raises the error in the thread that
    called it, where it is handled (PIPELINE_DEBUG=1: the traceback)."""
    if os.environ.get("PIPELINE_DEBUG") or args.exc_type is SystemExit:
        return threading.__excepthook__(args)
    name = args.thread.name if args.thread is not None else "a thread"
    what = _message(args.exc_value) if args.exc_value is not None else args.exc_type.__name__
    print(f"warning: background thread {name} stopped: {args.exc_type.__name__}: {what}", file=sys.stderr, flush=True)


def _close_progress_bars() -> None:
    """End any progress bar's line first, so the error starts a line of its own."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", None) or []):
        bar.close()


def _exit_interrupted() -> None:
    print("error: interrupted (Ctrl-C)", file=sys.stderr)
    sys.exit(EXIT_CTRL_C)


_ctrl_c_seen = False


def _on_ctrl_c(signum, frame) -> None:
    global _ctrl_c_seen
    _ctrl_c_seen = True
    signal.default_int_handler(signum, frame)  # KeyboardInterrupt, as always


def remember_ctrl_c() -> None:
    """Ctrl-C raises KeyboardInterrupt as usual and is also remembered. A KeyboardInterrupt raised while
    the interpreter runs a finalizer (`__del__`, a weakref callback: "Exception ignored in ...") or
    inside a library's bare `except:` is lost, and the run went on to exit 0; raise_if_interrupted
    raises it again. An ignored SIGINT (a background job) stays ignored; train installs its own handler."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_ctrl_c)


def raise_if_interrupted() -> None:
    """KeyboardInterrupt if a Ctrl-C came since remember_ctrl_c, even one that was swallowed: called
    before anything is marked complete, so no stage is committed after the user asked to stop."""
    if _ctrl_c_seen:
        raise KeyboardInterrupt


def clear_interrupt() -> None:
    """Forget a Ctrl-C that the command took as its way to end (predict.py --chat quits on it, exit 0)."""
    global _ctrl_c_seen
    _ctrl_c_seen = False


def _message(e: BaseException) -> str:
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    if isinstance(e, OSError) and e.strerror:  # from the system, not one of ours: not "[Errno 20] ..."
        return f"{os.fsdecode(e.filename)}: {e.strerror}" if e.filename else e.strerror
    return str(e)


def quiet_libraries(verbose: bool) -> None:
    """Library progress bars ("Saving the dataset", "Map", "Loading weights") and transformers' load
    reports only with --verbose: the pipeline draws one bar per stage and per training/eval phase."""
    if verbose:
        return
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")  # read when each library is imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import logging

    # accelerate's save of a model with tied weights (GPT-2's lm_head) warns on every checkpoint; the tie is restored on load
    logging.getLogger("accelerate.utils.other").setLevel(logging.ERROR)
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)  # "Creating initial MLflow database tables"
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.set_verbosity_error()
        sys.modules["transformers"].utils.logging.disable_progress_bar()


def end_process_group() -> None:
    """Destroy the default torch.distributed group, if this process joined one.

    A gloo group left for interpreter shutdown aborts the process about one run in four
    ("terminate called without an active exception", exit -6): its worker threads are still
    joinable when their C++ destructors run. Destroying it first makes a finished run exit 0.
    """
    dist = sys.modules.get("torch.distributed")  # never import torch just to find nothing to end
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
