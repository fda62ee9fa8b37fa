"""`kiln tune --rpc-tracker`: candidates measured on remote devices through TVM's RPC tracker."""

from __future__ import annotations

from ...errors import OptionsError


def parse_tracker(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OptionsError(
            f"bad RPC tracker address {text!r}", where="--rpc-tracker", fix="write it as HOST:PORT, e.g. 127.0.0.1:9190"
        )
    return host, int(port)


RPC_CANDIDATE_TIMEOUT_S = 30  # one remote candidate: get a device, upload, run; past it the candidate fails


def rpc_runner(opts):
    """MetaSchedule's RPC runner on the tracker's devices with `opts`' key (TuneOptions), as many in parallel as
    are free (or rpc_workers). A device that dies mid-run fails only the candidates it held."""
    import socket

    from tvm import rpc
    from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCConfig, RPCRunner
    from tvm.support.popen_pool import PopenPoolExecutor

    host, port = parse_tracker(opts.rpc_tracker)
    try:
        socket.create_connection((host, port), timeout=5).close()  # TVM's own client retries for a minute
        summary = rpc.connect_tracker(host, port).summary()
    except Exception as e:
        raise OptionsError(
            f"cannot reach the RPC tracker at {host}:{port}: {type(e).__name__}",
            where="--rpc-tracker",
            fix="start it: python -m tvm.exec.rpc_tracker --host HOST --port PORT",
        ) from None
    free = summary.get("queue_info", {}).get(opts.rpc_key, {}).get("free", 0)
    if not free:
        raise OptionsError(
            f"no free device with key {opts.rpc_key!r} at the tracker {host}:{port}",
            where="--rpc-key",
            fix=f"start one: python -m tvm.exec.rpc_server --tracker {host}:{port} --key {opts.rpc_key}",
        )
    workers = opts.rpc_workers or free
    runner = RPCRunner(
        RPCConfig(
            tracker_host=host,
            tracker_port=port,
            tracker_key=opts.rpc_key,
            session_timeout_sec=RPC_CANDIDATE_TIMEOUT_S,
            session_priority=1,
        ),
        EvaluatorConfig(number=3, repeat=1, min_repeat_ms=0, enable_cpu_cache_flush=False),
        max_workers=workers,
    )
    # MetaSchedule waits on each candidate's worker with no time limit: a worker whose tracker request never
    # gets a device (a server that died holding its slot, seen in tests) blocked the whole run for good. The
    # pool's own timeout kills such a worker, and the candidate fails with RPCRunner's "Timeout" result.
    runner.pool.shutdown(wait=False)
    runner.pool = PopenPoolExecutor(max_workers=workers, timeout=RPC_CANDIDATE_TIMEOUT_S)
    return runner, free
