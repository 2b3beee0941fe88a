"""Background prefetching: a producer thread fills a bounded queue; errors reach the consumer; clean close."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_POLL_S = 0.1


class _End:
    pass


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Prefetcher(Generic[T]):
    """Iterate `make()` in a background thread, at most `capacity` items ahead of the consumer.

    Iterating the prefetcher yields the items in order; an exception raised by the producer is re-raised in the
    consumer; `close()` (or leaving the `with` block) stops the producer and joins it. A consumer never waits
    forever on a dead producer.
    """

    def __init__(self, make: Callable[[], Iterable[T]], capacity: int = 3, name: str = "prefetch"):
        if capacity < 1:
            raise ValueError(f"prefetch capacity must be >= 1, got {capacity}")
        self._queue: queue.Queue[object] = queue.Queue(maxsize=capacity)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._produce, args=(make,), name=name, daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, make: Callable[[], Iterable[T]]) -> None:
        it: Iterator[T] | None = None
        try:
            it = iter(make())
            for item in it:
                if not self._put(item):
                    return
            self._put(_End())
        except BaseException as exc:  # noqa: BLE001 - everything must reach the consumer
            self._put(_Failure(exc))
        finally:
            close = getattr(it, "close", None)  # a generator's cleanup (e.g. cancelling its pending builds) now
            if close is not None:
                try:
                    close()
                except Exception:  # noqa: BLE001 - cleanup of an abandoned stream must not kill the thread
                    pass

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise RuntimeError("prefetch producer stopped without a result") from None
        if isinstance(item, _End):
            self._done = True
            raise StopIteration
        if isinstance(item, _Failure):
            self._done = True
            raise item.exc
        return item  # type: ignore[return-value]

    def close(self, timeout: float = 10.0) -> None:
        """Stop the producer (it finishes the item in progress) and join it."""
        self._stop.set()
        self._done = True
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self._stop.set()
