"""Helpers the CLI commands share."""

from __future__ import annotations

import re
import sys
import threading

import click

from suffixspec.fingerprint import TokenizerId
from suffixspec.pools.store import PoolError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """Seconds in ``7d``, ``12h``, ``30m``, ``45s`` or a plain number of seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text)
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration such as 7d, 12h, 30m or 45s")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def load_tokenizer(path: str):
    """``(TokenizerId, batch encoder)`` of a tokenizer.json, or a one-line CLI error."""
    from suffixspec.fingerprint import id_and_encoder

    try:
        return id_and_encoder(path)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--tokenizer") from None


def open_pool(path: str, tokenizer: TokenizerId | None = None, max_depth: int | None = None,
              recover: bool = False, **options):
    """A ``PersistentPool``, with pool errors turned into clean CLI errors.
    ``recover``: a maintenance command's open, which finishes what an
    interrupted command left (``PersistentPool.recover``)."""
    from pathlib import Path

    from suffixspec.pools.persistent import PersistentPool

    if tokenizer is None and not Path(path).exists():
        raise click.ClickException(f"no pool at {path}")
    try:
        pool = PersistentPool(path, tokenizer=tokenizer, max_depth=max_depth, **options)
        if recover:
            pool.recover()
        return pool
    except PoolError as e:
        raise click.ClickException(str(e)) from e


_COMPILING = "compiling kernels, first run only (about half a minute): "


class KernelLoader:
    """Compile (first run) or load (later runs) the kernels in a background thread.

    The caller goes on meanwhile (reading and tokenizing traces).  When it
    takes more than a second, which only a first run's compilation does, a
    line on stderr says so and follows the steps.
    """

    def __init__(self, steps=None):
        from suffixspec.native.warmup import STEPS

        self.steps = STEPS if steps is None else tuple(steps)
        self._lock = threading.Lock()
        self._bar = None
        self._step = None
        self._done = 0
        self._error: BaseException | None = None
        self.seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="suffixspec-kernels",
                                        daemon=True)
        self._timer = threading.Timer(1.0, self._show)
        self._timer.daemon = True

    def start(self) -> KernelLoader:
        self._thread.start()
        self._timer.start()
        return self

    def wait(self) -> float:
        """Block until the kernels are ready; returns the seconds they took."""
        self._thread.join()
        self._timer.cancel()
        with self._lock:
            if self._bar is not None:
                self._bar.set_description(_COMPILING + "done")
                self._bar.update(self._bar.total - self._bar.n)
                self._bar.close()
                self._bar = None
        if self._error is not None:
            raise self._error
        return self.seconds

    def _run(self) -> None:
        from suffixspec.kernels import compile_in_parallel

        try:
            self.seconds = compile_in_parallel(self.steps, self._progress)
        except BaseException as e:  # noqa: BLE001 - raised again by wait()
            self._error = e

    def _progress(self, step: str) -> None:
        with self._lock:
            if self._step is not None:
                self._done += 1
                if self._bar is not None:
                    self._bar.update(1)
            self._step = step
            if self._bar is not None:
                self._bar.set_description(_COMPILING + step)

    def _show(self) -> None:
        from tqdm import tqdm

        with self._lock:
            if not self._thread.is_alive():
                return
            self._bar = tqdm(total=len(self.steps), initial=self._done, file=sys.stderr,
                             desc=_COMPILING + (self._step or ""),
                             bar_format="{desc} ({n}/{total} steps, {elapsed})")
