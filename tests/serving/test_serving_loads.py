"""Loads of a model that clients ask for at once, in a loop, or overtake (issue 26): one session
built for what is already building, nothing for a load overtaken before it started, sessions
nobody wants released at once and their memory given back, one optimizer at a time, and a failure
said once a minute with its count. The rules (mcpd.serving.loads), the repository with real
onnxruntime sessions (the builder counts and holds them), then the real daemon's serving process
and its memory."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import onnxruntime
import psutil
import pytest

from mcpd.client import Client
from mcpd.config import ModelSection
from mcpd.events import Event, EventBus
from mcpd.optimize.background import Built, Optimizer
from mcpd.placement.plan import ModelPlacement
from mcpd.serving import backends
from mcpd.serving.backends import Backend
from mcpd.serving.errors import RequestError
from mcpd.serving.loads import Loads, Target
from mcpd.serving.repository import Repository
from tests.support.daemon import RunningDaemon
from tests.support.serving_models import heavy, scale

T = TypeVar("T")


def sessions() -> int:
    """onnxruntime sessions alive in this process, not yet freed."""
    return sum(isinstance(o, onnxruntime.InferenceSession) for o in gc.get_objects())


class Builds:
    """The repository's session builder: counts the sessions it builds (real ones), and while
    `held` is clear holds each build until it is set."""

    def __init__(self) -> None:
        self.count = 0
        self.held = threading.Event()
        self.held.set()
        self.started = threading.Semaphore(0)
        self._lock = threading.Lock()
        gc.collect()
        self._before = sessions()

    def __call__(self, model: ModelSection, placement: ModelPlacement) -> Backend:
        with self._lock:
            self.count += 1
        self.started.release()
        assert self.held.wait(30)
        return backends.load(model, placement)

    @property
    def alive(self) -> int:
        """Sessions alive in this process that were not before."""
        return sessions() - self._before

    def hold(self) -> None:
        """Hold the builds that start from now on."""
        self.started = threading.Semaphore(0)
        self.held.clear()

    async def wait_started(self) -> None:
        """Until a held build has started."""
        assert await asyncio.to_thread(self.started.acquire, True, 30)


def run(scenario: Callable[[Repository, list[Event]], Coroutine[Any, Any, T]], **kw: Any) -> T:
    """`scenario` against a repository on its own event loop, closed after it."""

    async def main() -> T:
        events: list[Event] = []
        bus = EventBus()
        bus.subscribe(events.append)
        repository = Repository(lambda name: 8, bus, 1 << 20, **kw)
        try:
            return await scenario(repository, events)
        finally:
            builder = kw.get("open_backend")
            if isinstance(builder, Builds):
                builder.held.set()  # a test that failed leaves no build held
            await repository.close()

    return asyncio.run(main())


async def settled(repository: Repository) -> None:
    while repository.loading:
        await asyncio.sleep(0.01)


async def spin() -> None:
    """Let every task that can run take its steps (up to where it waits)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def ran(coroutine: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task for `coroutine`, run up to where it waits."""
    task = asyncio.create_task(coroutine)
    await spin()
    return task


async def overtaken(task: asyncio.Task[None]) -> bool:
    try:
        await task
    except RequestError as exc:
        return "overtook this load" in str(exc)
    return False


def test_the_rules_join_wait_in_one_place_and_let_only_the_wanted_load_swap_in() -> None:
    old, new, newer = (Target(ModelSection(name="m", path="m.onnx"), (1, n)) for n in range(3))
    loads = Loads()
    first, start, overtaken = loads.want(old)
    assert start is first and overtaken is None and loads.building is first
    assert loads.want(old) == (first, None, None)  # joined
    second, start, overtaken = loads.want(new)
    assert start is None and overtaken is None and loads.waiting is second
    third, start, overtaken = loads.want(newer)
    assert start is None and overtaken is second and loads.waiting is third
    assert loads.want(old) == (first, None, third)  # the build in progress is wanted again
    assert loads.finished(first) == (True, None)
    assert loads.serves(old) and not loads.serves(new)


def test_the_rules_after_an_unload_release_the_build_and_start_the_waiting_load() -> None:
    old, new = (Target(ModelSection(name="m", path="m.onnx"), (1, n)) for n in range(2))
    loads = Loads()
    first, _, _ = loads.want(old)
    second, _, _ = loads.want(new)
    assert loads.drop() is second and loads.wanted is None  # answered, never built
    assert loads.finished(first) == (False, None)  # released unused
    first, _, _ = loads.want(old)
    second, _, _ = loads.want(new)
    assert loads.finished(first) == (False, second) and loads.building is second
    with pytest.raises(ValueError, match="only the load being built"):
        loads.finished(first)


def test_sixteen_loads_of_a_model_at_once_build_one_session(tmp_path: Path) -> None:
    builds = Builds()
    model = ModelSection(name="m", path=str(scale(tmp_path / "m.onnx")))

    async def scenario(repository: Repository, events: list[Event]) -> None:
        await repository.apply((model,))
        await settled(repository)
        builds.hold()
        loads = [await ran(repository.load("m")) for _ in range(16)]
        await builds.wait_started()
        builds.held.set()
        await asyncio.gather(*loads)  # every one answered as loaded: they joined one load
        assert builds.count == 2  # the first load at start, and one for the 16
        assert builds.alive == 1  # the one serving; the one it replaced is released

    run(scenario, open_backend=builds)


def test_a_load_overtaken_before_it_started_costs_nothing(tmp_path: Path) -> None:
    builds = Builds()
    path = scale(tmp_path / "m.onnx", width=4)
    model = ModelSection(name="m", path=str(path))

    def replace(width: int) -> None:
        scale(tmp_path / "new.onnx", width=width)
        os.replace(tmp_path / "new.onnx", path)

    async def scenario(repository: Repository, events: list[Event]) -> None:
        await repository.apply((model,))
        await settled(repository)
        builds.hold()
        replace(5)
        building = await ran(repository.load("m"))
        await builds.wait_started()
        replace(6)
        second = await ran(repository.load("m"))  # waits for the build in progress
        replace(8)
        third = await ran(repository.load("m"))  # takes the waiting place
        assert second.done() and await overtaken(second)  # answered at once, nothing built
        builds.held.set()
        assert await overtaken(building)  # built, then released unused
        await third
        assert builds.count == 3  # at start, `building`, `third`
        assert builds.alive == 1
        entry = repository.entries["m"]
        assert entry.worker is not None and entry.worker.backend.inputs[0].shape == (-1, 8)

    run(scenario, open_backend=builds)


def test_a_load_unloaded_and_loaded_again_while_it_builds_is_built_once(tmp_path: Path) -> None:
    builds = Builds()
    model = ModelSection(name="m", path=str(scale(tmp_path / "m.onnx")))

    async def scenario(repository: Repository, events: list[Event]) -> None:
        await repository.apply((model,))
        await settled(repository)
        builds.hold()
        first = await ran(repository.load("m"))
        await builds.wait_started()
        await repository.unload("m")
        again = await ran(repository.load("m"))  # wants the build in progress again
        builds.held.set()
        await asyncio.gather(first, again)
        assert builds.count == 2 and builds.alive == 1
        assert repository.entries["m"].state == "ready"

    run(scenario, open_backend=builds)


def test_a_session_unloaded_while_it_builds_is_released_as_it_ends(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    builds = Builds()
    model = ModelSection(name="m", path=str(scale(tmp_path / "m.onnx")))

    async def scenario(repository: Repository, events: list[Event]) -> None:
        await repository.apply((model,))
        await settled(repository)
        builds.hold()
        load = await ran(repository.load("m"))
        await builds.wait_started()
        await repository.unload("m")
        builds.held.set()
        assert await overtaken(load)
        assert builds.alive == 0  # nothing kept a reference to it
        assert repository.entries["m"].state == "unloaded"

    with caplog.at_level(logging.INFO, "mcpd.serving"):
        run(scenario, open_backend=builds)
    assert "a session built is released unused" in caplog.text


class HeldOptimizer(Optimizer):
    """The background optimizer, its build held until the test ends (the real one runs
    `mcpd optimize` for seconds to minutes): counts the builds started."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.started = 0

    async def build(self, model: ModelSection) -> Built:
        self.started += 1
        await asyncio.Event().wait()
        raise AssertionError("never reached")


def test_loads_in_a_loop_start_one_optimization(tmp_path: Path) -> None:
    calibration = tmp_path / "calibration"
    calibration.mkdir()
    model = ModelSection(
        name="m",
        path=str(scale(tmp_path / "m.onnx")),
        optimize="fp32",
        calibration=str(calibration),
    )
    optimizer = HeldOptimizer(tmp_path / "state")

    async def scenario(repository: Repository, events: list[Event]) -> None:
        await repository.apply((model,))
        await settled(repository)
        for _ in range(5):
            await repository.load("m")
        await spin()
        assert optimizer.started == 1

    run(scenario, optimizer=optimizer)


def test_a_failure_repeated_in_a_loop_is_said_once_a_minute_with_its_count(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"not a model")
    now = [1000.0]

    async def scenario(repository: Repository, events: list[Event]) -> list[Event]:
        await repository.apply((ModelSection(name="m", path=str(path)),))
        await settled(repository)
        for _ in range(20):
            with pytest.raises(RequestError, match="onnxruntime cannot load"):
                await repository.load("m")
        now[0] += 60
        with pytest.raises(RequestError):
            await repository.load("m")
        path.unlink()  # another reason: said at once
        with pytest.raises(RequestError, match="does not exist"):
            await repository.load("m")
        return [e for e in events if e.data.get("state") == "failed"]

    with caplog.at_level(logging.ERROR, "mcpd.serving"):
        failures = run(scenario, clock=lambda: now[0])
    first, again, other = failures
    assert first.message.startswith(f"model m failed to load: onnxruntime cannot load {path}")
    assert first.data["unsaid"] == 0
    assert again.message == first.message + " (20 more times since this was last said)"
    assert again.data == {"model": "m", "state": "failed", "unsaid": 20}
    assert other.message == f"model m failed to load: model file {path} does not exist"
    assert [r.getMessage() for r in caplog.records] == [e.message for e in failures]


def test_loads_in_a_loop_say_what_the_backend_settled_for_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = ModelSection(name="m", path=str(scale(tmp_path / "m.onnx")))  # TensorRT, CUDA, CPU
    now = [1000.0]

    async def scenario(repository: Repository, events: list[Event]) -> None:
        await repository.apply((model,))
        await settled(repository)
        for _ in range(5):
            await repository.load("m")
        now[0] += 60
        await repository.load("m")

    with caplog.at_level(logging.WARNING, "mcpd.serving"):
        run(scenario, clock=lambda: now[0])
    said = [r.getMessage() for r in caplog.records if "not available" in r.getMessage()]
    assert len(said) == 2 and said[0].startswith("model m: TensorrtExecutionProvider")
    assert said[1] == said[0] + " (5 more times since this was last said)"


def test_sixteen_loads_that_hang_up_cost_the_serving_process_one_session(tmp_path: Path) -> None:
    """Issue 26's figure: 16 load requests whose clients hung up added 1.6 GB to serving for
    good. Here a 42 MB model: the 16 loads and one more leave the serving process within two
    models of where it was (glibc keeps what a closed session freed unless trimmed: +90 MB after
    one reload)."""
    model = heavy(tmp_path / "heavy.onnx")
    model_mb = model.stat().st_size / 1e6
    sock = tmp_path / "mcpd.sock"
    daemon = RunningDaemon(
        tmp_path,
        f'[daemon]\nsocket = "{sock}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'[[models]]\nname = "heavy"\npath = "{model}"\nmax_batch = 4\n',
    )

    def ready() -> bool:
        try:
            with Client(str(sock), timeout=5) as client:
                return client.model_ready("heavy")
        except OSError:
            return False

    try:
        daemon.wait_for(ready, 60)
        with Client(str(sock), timeout=60) as client:
            serving = psutil.Process(client.status()["serving"]["pid"])
            started = serving.memory_info().rss / 1e6
            for _ in range(16):
                with socket.socket(socket.AF_UNIX) as hangs_up:
                    hangs_up.connect(str(sock))
                    hangs_up.sendall(
                        b"POST /v2/repository/models/heavy/load HTTP/1.1\r\n"
                        b"Host: mcpd\r\nContent-Length: 0\r\n\r\n"
                    )
            # Said once: the same reload again within a minute is counted, not said.
            daemon.wait_for(lambda: "model heavy reloaded" in daemon.log.read_text(), 60)
            client.load("heavy")  # answered once everything asked before it is done
            after = serving.memory_info().rss / 1e6
        assert after - started < 2 * model_mb, (started, after, model_mb)
    finally:
        daemon.close()


def test_a_model_reloaded_in_a_loop_is_said_once_a_minute_with_its_count(tmp_path: Path) -> None:
    model = ModelSection(name="m", path=str(scale(tmp_path / "m.onnx")))
    now = [1000.0]

    async def scenario(repository: Repository, events: list[Event]) -> list[Event]:
        await repository.apply((model,))
        await settled(repository)
        for _ in range(6):
            await repository.load("m")
        now[0] += 60
        await repository.load("m")
        return [e for e in events if e.data.get("state") == "ready"]

    loaded, reloaded, later = run(scenario, clock=lambda: now[0])
    assert loaded.message.startswith("model m loaded in") and loaded.data["unsaid"] == 0
    assert reloaded.message.startswith("model m reloaded in") and reloaded.data["unsaid"] == 0
    assert later.message.endswith("(5 more times since this was last said)")
    assert later.data == {"model": "m", "state": "ready", "unsaid": 5}
