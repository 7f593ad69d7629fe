"""The evaluator spread over a Ray cluster (`--ray ADDRESS`): one evaluator pool per GPU of every node (on a cluster
without GPUs, one per node), each exactly the single-machine `Evaluator` on its node (judge and runner pairs,
sandbox, build cache), and a driver-side stand-in with the same `submit` / `wait` that hands candidates to them.

- Dispatch: each pool holds at most as many candidates as it builds at once plus the judge and runner pairs it
  sets up ahead, so that a slow pool is not handed more than it can start; identical (task, code) records of one
  submission go to one pool and share its result, as on one machine.
- A node that dies costs only the candidates its pool held: their calls fail with `RayActorError`, and they are
  handed to the pools left. A result comes back once from the pool that finished it, so no line is lost or doubled.
- Builds: a pool that is to compile an extension first asks the cluster's `Libraries` whether another node built
  it (keyed by the build cache's digest and the Python ABI); one that has gets the library through Ray's object
  store, checked against the sha256 its build recorded before it is put in this node's cache. The pool that
  built it ships only a library whose bytes match the digest recorded when its compile child made it.
- Pools are named by their settings: the ranks of one training run, each a driver of its own, share them.

Every node runs the same checkout (the tasks and the repository at the same path) in the same environment, as a
Ray cluster made from one image does. Ray is imported by this module alone, only in this mode.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import json
import socket
import sys
import sysconfig
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

NAMESPACE = "kevin"
POOL_START_S = 60.0  # how long a new pool waits out the named pool of a driver that is ending
SHIPPED_WAIT_S = 900.0  # the longest a pool waits for another node's build of an extension before building it itself


def connect(address: str) -> None:
    """Join the cluster at `address` ('auto': the one this machine's `ray start` joined); a one-line error where
    there is none."""
    if ray.is_initialized():
        return
    if address != "auto":  # ray.init would retry an address nobody answers at for minutes
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=10).close()
        except (OSError, ValueError) as e:
            raise SystemExit(f"error: --ray {address}: no Ray cluster answers there ({e}); start one with "
                             "`ray start --head` (docs/cluster.md)") from None
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR",
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SystemExit(f"error: --ray {address}: no Ray cluster to join ({message}); start one with "
                         "`ray start --head` (docs/cluster.md)") from None


def pool_places(cfg) -> tuple[str, list[dict]]:
    """('cuda' or 'cpu', one {'node', 'address', 'gpu', 'cpus'} per pool): a pool per GPU of every node that has
    GPUs, or for C++ candidates one per node that has CPUs; `cpus` are the node's CPUs (as its `ray start` gave
    them) that the pool builds on."""
    connect(cfg.ray)
    nodes = [n for n in ray.nodes() if n["Alive"]]
    kind = cfg.device if cfg.device != "auto" else \
        "cuda" if any(n["Resources"].get("GPU") for n in nodes) else "cpu"
    places = []
    for node in nodes:
        gpus, cpus = int(node["Resources"].get("GPU", 0)), int(node["Resources"].get("CPU", 0))
        count = gpus if kind == "cuda" else min(cpus, 1)  # a node started with --num-cpus=0 only coordinates
        places += [{"node": node["NodeID"], "address": node["NodeManagerAddress"], "gpu": kind == "cuda",
                    "cpus": max(1, cpus // max(1, count))} for _ in range(count)]
    if not places:
        raise SystemExit(f"error: --ray {cfg.ray}: no node of the cluster has a {'GPU' if kind == 'cuda' else 'CPU'}")
    return kind, places


def cluster_device(cfg) -> tuple[str, list[str]]:
    """resolve_device's answer on a cluster: the kind, and one name per pool."""
    kind, places = pool_places(cfg)
    return kind, [f"{kind} on {p['address']}" for p in places]


def settings_key(cfg, tasks: list[str]) -> str:
    """What names a run's pools and library registry: every setting they judge with, and the tasks (not those set
    per pool, nor the driver's own core count: the ranks of one run, on machines of any size, share them)."""
    own = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("ray", "gpus", "compile_workers", "progress")}
    text = json.dumps([own, sorted(set(tasks))], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def start_pool(name: str, place: dict, cfg, tasks: list[str], libraries):
    """The pool of that name (another driver's with the same settings), else a new one on its node, once it has
    set itself up. One of a driver that has just ended may still be going: it is waited out (up to a minute)."""
    deadline = time.monotonic() + POOL_START_S
    while True:
        pool = Pool.options(name=name, get_if_exists=True, num_cpus=0, num_gpus=1 if place["gpu"] else 0,
                            scheduling_strategy=NodeAffinitySchedulingStrategy(place["node"], soft=False)
                            ).remote(cfg, tasks, libraries)
        try:
            ray.get(pool.ready.remote())
            return pool
        except RayActorError as e:
            if time.monotonic() > deadline:
                reason = [line.strip() for line in str(e).splitlines() if line.strip()][-2:]
                raise SystemExit(f"error: --ray: the evaluator on {place['address']} did not start: "
                                 + " ".join(reason)) from None
            time.sleep(2)


class ClusterEvaluator:
    """The `Evaluator`'s stand-in on a cluster: `submit(records, tags)`, `wait()` for (tag, result) pairs,
    `seconds()`, used as a context manager. Results come back in the caller's thread, from `wait`."""

    def __init__(self, cfg, tasks: list[str], expected: int = 0, on_result=None):
        self.on_result = on_result
        self.kind, places = pool_places(cfg)
        key = settings_key(cfg, tasks)
        self.libraries = Libraries.options(name=f"libraries-{key}", get_if_exists=True, num_cpus=0).remote()
        self.pools = {}  # actor -> (where it is, how many candidates it may hold)
        for number, place in enumerate(places):
            local = dataclasses.replace(cfg, ray=None, device=self.kind, gpus=None, progress=False,
                                        compile_workers=place["cpus"])
            pool = start_pool(f"pool-{key}-{place['node'][:16]}-{number}", place, local, tasks, self.libraries)
            self.pools[pool] = (place["address"], place["cpus"] + cfg.spare_children)
        self.waiting: collections.deque = collections.deque()  # (record, tags) not yet handed to a pool
        self.running: dict = {}  # the call's ObjectRef -> (pool, record, tags)

    def __enter__(self) -> ClusterEvaluator:
        return self

    def __exit__(self, *error) -> None:
        """The pools stay up for the other drivers that share them; they end with the driver that made them."""

    def submit(self, records: list[dict], tags) -> None:
        groups: dict[tuple[str, str], tuple[dict, list]] = {}
        for tag, record in zip(tags, records):
            groups.setdefault((str(record.get("task")), str(record.get("code"))), (record, []))[1].append(tag)
        self.waiting.extend(groups.values())

    def dispatch(self) -> None:
        """Hand waiting candidates to the pools with room, the least loaded first."""
        load = collections.Counter(pool for pool, _, _ in self.running.values())
        while self.waiting:
            free = [p for p, (_, room) in self.pools.items() if load[p] < room]
            if not free:
                return
            pool = min(free, key=lambda p: load[p] / self.pools[p][1])
            record, tags = self.waiting.popleft()
            self.running[pool.judge.remote(record)] = (pool, record, tags)
            load[pool] += 1

    def wait(self) -> list[tuple]:
        """The (tag, result) pairs finished since the last call, at least one. A pool whose node died is dropped,
        and what it held is handed to the others."""
        items = []
        while not items:
            self.dispatch()
            if not self.running:
                raise RuntimeError("wait() with nothing submitted")
            ray.wait(list(self.running), num_returns=1)
            done, _ = ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
            for ref in done:
                pool, record, tags = self.running.pop(ref)
                try:
                    result = ray.get(ref)
                except RayActorError:
                    self.lose(pool)
                    self.waiting.appendleft((record, tags))
                    continue
                for tag in tags:
                    own = dict(result, time_s=dict(result["time_s"]))
                    items.append((tag, own))
                    if self.on_result:
                        self.on_result(tag, own)
        return items

    def lose(self, pool) -> None:
        if pool not in self.pools:
            return
        address, _ = self.pools.pop(pool)
        held = sum(p is pool for p, _, _ in self.running.values()) + 1
        print(f"the evaluator on {address} is gone (its node died?): its {held} candidate(s) run again on the "
              f"{len(self.pools)} left", file=sys.stderr)
        if not self.pools:
            raise SystemExit("error: no evaluator of the Ray cluster is left; what finished is kept (re-run to "
                             "resume with -o)")

    def seconds(self) -> dict[str, float]:
        """The pools' build and check seconds, summed over them (the other drivers sharing them included)."""
        total = collections.Counter()
        for pool in self.pools:
            total.update(ray.get(pool.seconds.remote()))
        return dict(total)


@ray.remote
class Pool:
    """One evaluator on its node: today's `Evaluator`, kept open for the pool's life, judging each `judge` call as
    a submission of one record. Calls from every driver run at once, each a coroutine waiting for its result: an
    async actor, since a threaded one starts a thread per call it may hold, all of them up front."""

    def __init__(self, cfg, tasks: list[str], libraries):
        from kevin.evaluator import Evaluator

        if not Path(cfg.tasks).exists():
            raise FileNotFoundError(f"no task folder {cfg.tasks} on this node: every node runs the same checkout")
        shipped = ShippedBuilds(libraries)
        self.evaluator = Evaluator(cfg, tasks, expected=sys.maxsize, shipped_builds=shipped).__enter__()
        self.futures: dict[int, Future] = {}
        self.tags, self.lock = iter(range(sys.maxsize)), threading.Lock()
        threading.Thread(target=self.hand_back, daemon=True).start()

    def ready(self) -> bool:
        return True

    def hand_back(self) -> None:
        """Each result to the call waiting for it; an error of the evaluator's to every call."""
        while True:
            try:
                finished = self.evaluator.wait()
            except Exception as error:  # noqa: BLE001 - a failed thread of the evaluator: every call hears of it
                with self.lock:
                    for future in self.futures.values():
                        future.set_exception(error)
                return
            with self.lock:
                for tag, result in finished:
                    self.futures.pop(tag).set_result(result)

    async def judge(self, record: dict) -> dict:
        with self.lock:
            tag = next(self.tags)
            future = self.futures[tag] = Future()
        self.evaluator.submit([record], [tag])
        return await asyncio.wrap_future(future)

    def seconds(self) -> dict[str, float]:
        return self.evaluator.seconds()


@ray.remote
class Libraries:
    """Which node built which extension: the cluster's registry of built libraries, each an object in Ray's object
    store with the sha256 of its bytes. The first pool to ask for a key builds it; one asking meanwhile waits."""

    def __init__(self):
        self.built: dict[str, tuple] = {}  # key -> ([ObjectRef of the bytes], sha256)
        self.building: dict[str, asyncio.Event] = {}

    async def claim(self, key: str, wait_s: float):
        """The built library's ([ref], sha256), or None: build it yourself (and `publish`)."""
        if key not in self.built and key in self.building:
            try:
                await asyncio.wait_for(self.building[key].wait(), wait_s)
            except asyncio.TimeoutError:
                return None
        if key in self.built:
            return self.built[key]
        self.building.setdefault(key, asyncio.Event())
        return None

    async def publish(self, key: str, shipped) -> None:
        """A build done (`shipped`: ([ref], sha256)) or failed (None): the pools waiting for it go on."""
        if shipped is not None:
            self.built[key] = shipped
        if key in self.building:
            self.building.pop(key).set()


class ShippedBuilds:
    """The build cache's link to the other nodes (BuildCache's `shared`), in a pool's process: `fetch` puts another
    node's build of an extension in this node's cache; `publish` offers this node's build to the others."""

    def __init__(self, libraries):
        self.libraries = libraries
        self.abi = f"{sysconfig.get_config_var('EXT_SUFFIX')}"  # with the digest (torch, sources, flags, arch)

    def fetch(self, digest: str, library: Path) -> bool:
        """Whether another node's build of `digest` is now `library` here, its bytes checked against the sha256
        recorded when it was built. False: build it here (a missing or lost object, or a digest that differs,
        is one more build, never a library loaded unchecked)."""
        from kevin.build_cache import _record_digest

        try:
            shipped = ray.get(self.libraries.claim.remote(digest + self.abi, SHIPPED_WAIT_S))
        except RayError:  # the registry went with the driver that made it
            return False
        if shipped is None:
            return False
        [ref], sha256 = shipped
        try:
            data = ray.get(ref, timeout=SHIPPED_WAIT_S)
        except (RayError, GetTimeoutError):  # the node that built it is gone, and its object with it
            return False
        if hashlib.sha256(data).hexdigest() != sha256:
            return False
        library.parent.mkdir(parents=True, exist_ok=True)
        partial = library.with_name(library.name + ".partial")
        partial.write_bytes(data)
        partial.rename(library)
        _record_digest(library)
        return True

    def publish(self, digest: str, library: Path | None) -> None:
        """Offer this node's build (None: it failed): the library's bytes, if they are what its build recorded."""
        from kevin.build_cache import _digest_file

        shipped = None
        if library is not None:
            data = library.read_bytes()
            sha256 = hashlib.sha256(data).hexdigest()
            if _digest_file(library).read_text() == sha256:
                shipped = ([ray.put(data)], sha256)
        self.libraries.publish.remote(digest + self.abi, shipped)
