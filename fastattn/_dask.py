"""The Dask path: fastattn's functions on Dask arrays, as lazy graphs.

Reached from :mod:`fastattn._dispatch` only when the caller passed a Dask array, so Dask is
imported only then; the public functions hand their call on as it was made. Each block of
the graph calls a backend directly on its chunks, never the public functions: NumPy chunks
the CPU backend (:mod:`fastattn._cpu`, with the threads described in
:func:`task_threads`), CuPy chunks the CUDA backend.

How the graph is cut (docs/semantics.md, "Dask arrays"):

* leading (batch) dims, heads and query rows are independent: one task per chunk. A
  query-head chunk either lies inside one GQA group or starts and ends on group bounds, so
  it reads one chunk of key/value heads;
* key/value length may be chunked: each (query chunk, key chunk) pair computes
  ``(out, lse)`` over its keys with the block's absolute diagonal offset (causal, window)
  and its valid lengths shifted by the chunk start; a tree of
  :func:`fastattn.merge_attention_states` combines them. Blocks entirely masked (above the
  causal diagonal, outside the window, past every valid length known when the graph is
  built) are not in the graph;
* feature axes (E, Ev) and the softmax axis of ``masked_softmax`` are rechunked to one
  chunk.

Arguments are checked when the graph is built, by the CPU path's validation layer on
NumPy stand-ins (same shape and dtype, no data), so errors are the CPU path's word for
word; the values of a Dask ``valid_lens`` are checked in its tasks.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading

import dask
import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from fastattn import _cpu, _cuda, _threads
from fastattn._checks import check_flag
from fastattn._cuda import standin
from fastattn._validation import (
    additive_args,
    attention_spec,
    check_unbatched_mask,
    check_valid_lens,
    head_valid_lens,
    layer_inputs,
    masked_softmax_args,
    merge_states_args,
    regression_args,
    sdpa_args,
)

MERGE_FANOUT = 4  # parts per merge task: a tree of depth log4(key chunks)


# --------------------------------------------------------------------------------------
# Threads inside a task


_blocks_running = 0  # fastattn blocks running in this process now, in any thread
_blocks_lock = threading.Lock()


def _block(fn):
    """A task function of the graph, counted while it runs: :func:`task_threads` divides
    the threads among the blocks that run at once in this process."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        global _blocks_running
        with _blocks_lock:
            _blocks_running += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with _blocks_lock:
                _blocks_running -= 1

    return run


def task_threads(num_threads: int | None) -> int:
    """Threads for one block: ``num_threads`` if given, else fastattn's default divided by
    the tasks that run beside this one, so the worker's cores are not oversubscribed.
    A ``distributed`` worker runs ``nthreads`` tasks at once; elsewhere (the threaded
    scheduler, the synchronous one, from the main thread or any other) the divisor is the
    number of fastattn blocks running in this process at that moment, this one included:
    a one-block graph, or the synchronous scheduler called from a worker thread, gets all
    of fastattn's threads; a full pool of blocks gets its share each. (The divisor was
    the pool's size whenever the block ran off the main thread, which gave a lone block
    one thread.)"""
    if num_threads is not None:
        return _threads.resolve(num_threads)
    total = _threads.resolve(None)
    slots = None
    distributed = sys.modules.get("distributed")
    if distributed is not None:
        try:
            worker = distributed.get_worker()
        except ValueError:  # not inside a distributed worker
            worker = None
        if worker is not None:
            slots = getattr(worker, "state", worker).nthreads
    if slots is None:
        slots = _blocks_running
    return max(1, total // max(1, slots))


# --------------------------------------------------------------------------------------
# Arguments


def is_dask(a: object) -> bool:
    return isinstance(a, da.Array)


def _require_dask(named: dict) -> None:
    """The main array arguments must all be Dask arrays once one argument is (masks and
    lengths may be NumPy arrays; fastattn never pulls a Dask array into memory)."""
    for name, value in named.items():
        if not is_dask(value):
            raise TypeError(
                f"{name} is a {type(value).__module__}.{type(value).__name__}, not a Dask "
                f"array: pass all of {', '.join(named)} as Dask arrays when one argument is "
                f"(dask.array.from_array({name}) wraps an array)"
            )
        if any(np.isnan(n) for n in value.shape):
            raise ValueError(
                f"{name} has unknown chunk sizes (shape {value.shape}): call "
                f"{name}.compute_chunk_sizes() first"
            )


def _no_out(out: object) -> None:
    if out is not None:
        raise TypeError(
            "out= is not supported for Dask arrays (the result is a lazy Dask array): "
            "leave it None, or store the result with dask.array.store"
        )


def _host_or_standin(a):
    """For the validation layer: a NumPy array as is, a Dask array's stand-in."""
    if a is None:
        return None
    if is_dask(a):
        return standin(a)
    return np.asarray(a)


def _attention_standins(query, key, value, attn_mask, valid_lens, out, params: dict):
    """What the checks read of an attention call (q/k/v must be Dask arrays, ``params``
    NumPy arrays, ``out`` None): the stand-ins of q/k/v, the mask's and lengths' (NumPy
    ones as they are)."""
    _require_dask({"query": query, "key": key, "value": value})
    _host_params(params)
    _no_out(out)
    return (
        standin(query),
        standin(key),
        standin(value),
        _host_or_standin(attn_mask),
        _host_or_standin(valid_lens),
    )


def _host_params(named: dict) -> None:
    for name, value in named.items():
        if is_dask(value):
            raise TypeError(
                f"{name} must be a NumPy array (parameters are not chunked), got a Dask "
                f"array: pass {name}.compute()"
            )


def _as_dask(a, dtype=None):
    """A Dask array (NumPy arrays wrapped in one chunk; rechunked by :func:`_aligned`)."""
    if is_dask(a):
        return a
    return da.from_array(np.asarray(a, dtype=dtype))


def _portable(fn):
    """Build the graph with Dask's task-based rechunking (reshape's included), so it runs
    on any scheduler: with a distributed client active Dask would otherwise pick its P2P
    method, which runs only there."""

    @functools.wraps(fn)
    def build(*args, **kwargs):
        with dask.config.set({"array.rechunk.method": "tasks"}):
            return fn(*args, **kwargs)

    return build


def _rechunk(a, chunks):
    return a.rechunk(chunks, method="tasks")  # not P2P: see _portable


def _aligned(a, target_chunks: tuple):
    """``a`` (rank of ``target_chunks``) rechunked to ``target_chunks``, except its size-1
    (broadcast) axes, which stay one chunk."""
    chunks = tuple((1,) if n == 1 else c for n, c in zip(a.shape, target_chunks))
    return _rechunk(a, chunks)


def _block_key(a, index: tuple) -> tuple:
    """The graph key of ``a``'s block at the target grid's ``index`` (size-1 axes: 0)."""
    return (a.name, *(0 if n == 1 else i for n, i in zip(a.shape, index)))


def _bounds(chunks: tuple) -> list:
    """[(start, stop)] of each chunk along one axis."""
    starts = np.cumsum((0,) + tuple(chunks))
    return [(int(starts[i]), int(starts[i + 1])) for i in range(len(chunks))]


def _expand(a, rank: int):
    """``a`` with leading size-1 axes up to ``rank`` (NumPy broadcasting's alignment)."""
    return a.reshape((1,) * (rank - a.ndim) + tuple(a.shape)) if a.ndim < rank else a


def _group_chunks(chunks: tuple, group: int) -> tuple:
    """Query-head chunks that each lie inside one GQA group or start and stop on group
    bounds, so each reads one chunk of key/value heads."""
    ok = True
    for start, stop in _bounds(chunks):
        inside = start // group == (stop - 1) // group
        aligned = start % group == 0 and stop % group == 0
        ok = ok and (stop == start or inside or aligned)
    if ok:
        return chunks
    total = sum(chunks)
    size = chunks[0]
    if size >= group:
        size = group * (size // group)
    else:
        size = max(d for d in range(1, size + 1) if group % d == 0)
    return tuple(min(size, total - s) for s in range(0, total, size))


# --------------------------------------------------------------------------------------
# Block functions (run inside tasks)


def _part_mask(q, k, diag: int, causal: bool, window: tuple):
    """The block's causal/window constraint as a boolean mask, in the chunks' array module
    (for chunks the CPU kernels cannot take an offset for: CuPy)."""
    xp = sys.modules[type(q).__module__.split(".")[0]]
    i = xp.arange(q.shape[-2])[:, None]
    j = xp.arange(k.shape[-2])[None, :]
    keep = xp.ones((q.shape[-2], k.shape[-2]), dtype=bool)
    left, right = window
    if causal:
        keep &= j - i <= diag
    if right >= 0:
        keep &= j - i <= diag + right
    if left >= 0:
        keep &= j - i >= diag - left
    return keep


def _constrained(q, k, mask, diag: int, causal: bool, window: tuple):
    """``mask`` with the block's causal/window constraint folded in (bool: AND; float:
    ``-inf`` where the constraint masks), or ``mask`` itself when there is none."""
    if not causal and window == (-1, -1):
        return mask
    keep = _part_mask(q, k, diag, causal, window)
    if mask is None:
        return keep
    if mask.dtype == bool:
        return mask & keep
    xp = sys.modules[type(mask).__module__.split(".")[0]]
    return xp.where(keep, mask, mask.dtype.type(-np.inf))


@_block
def _sdpa_part(q, k, v, mask, lens, opts: dict, key_start: int, diag: int):
    """``(out, lse)`` of one (query chunk, key chunk) block in the compute dtype."""
    threads = task_threads(opts["num_threads"])
    if lens is not None:
        lens = np.asarray(lens)
        check_valid_lens(lens, lens.shape, opts["num_keys"])  # a Dask valid_lens' values
        lens = np.clip(lens.astype(np.int64) - key_start, 0, k.shape[-2])
    if opts["compute_dtype"] != q.dtype:
        q = q.astype(opts["compute_dtype"])  # float16: partial results kept in float32
    window = opts["window"]
    if not _cuda.uses_gpu(q):
        args = sdpa_args(
            q, k, v, mask, lens, opts["is_causal"], "top_left", None, opts["scale"], opts["softcap"]
        )
        args.diag_offset = diag  # the block's absolute offset
        args.window = window
        args.is_causal = opts["is_causal"]
        return _cpu.sdpa(args, None, True, opts["weights_out"], threads)
    # CuPy chunks: the offset constraint as a mask, for the CUDA backend.
    mask = _constrained(q, k, mask, diag, opts["is_causal"], window)
    return _cuda.scaled_dot_product_attention(
        q,
        k,
        v,
        mask,
        valid_lens=lens,
        scale=opts["scale"],
        softcap=opts["softcap"],
        return_lse=True,
        return_weights=opts["weights_out"],
        num_threads=threads,
    )


def _block_weights(part, root, dtype):
    """A block's weights over the union of the keys: its own weights scaled by
    ``exp(lse_block - lse)`` (0 where the block saw no key of the row)."""
    lse_part, weights, lse = part[1], part[2], root[1]
    with np.errstate(invalid="ignore", over="ignore"):
        factor = np.where(np.isneginf(lse_part), 0.0, np.exp(lse_part - lse))
    return (weights * factor[..., None].astype(weights.dtype)).astype(dtype, copy=False)


def _zeros(shape: tuple, dtype):
    return np.zeros(shape, dtype)


def _merge_parts(parts: list, num_threads: int | None):
    if len(parts) == 1:
        return parts[0]
    return _merge_block([p[0] for p in parts], [p[1] for p in parts], num_threads)


def _empty_state(out_shape: tuple, dtype):
    """The state of rows that see no key: zeros and lse -inf."""
    return np.zeros(out_shape, dtype), np.full(out_shape[:-1], -np.inf, dtype)


def _take(pair, i: int, dtype):
    return pair[i].astype(dtype, copy=False)


def _astype(a, dtype):
    return a.astype(dtype, copy=False)


# --------------------------------------------------------------------------------------
# scaled_dot_product_attention


def _full_rank(a, batch: tuple):
    """q/k/v as ``batch + (H, L, E)`` (broadcast leading dims: views, not copies)."""
    a = a if a.ndim >= 3 else a[None]
    a = _expand(a, len(batch) + 3)
    target = batch + tuple(a.shape[-3:])
    return a if tuple(a.shape) == target else da.broadcast_to(a, target)


def _block_is_empty(q_rng, k_rng, diag0: int, causal: bool, window: tuple, max_len) -> bool:
    """Whether every (row, key) of a block is masked by causal/window/valid lengths."""
    (qs, qe), (ks, ke) = q_rng, k_rng
    if qe == qs or ke == ks:
        return True
    left, right = window
    first_row, last_row = qs + diag0, qe - 1 + diag0  # each row's diagonal key
    if causal and ks > last_row:
        return True
    if right >= 0 and ks > last_row + right:
        return True
    if left >= 0 and ke - 1 < first_row - left:
        return True
    return max_len is not None and max_len <= ks


@_portable
def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    *,
    valid_lens=None,
    return_lse=False,
    return_weights=False,
    out=None,
    num_threads=None,
    **options,
):
    """The graph of a scaled_dot_product_attention call; ``options`` (is_causal,
    causal_alignment, window, scale, softcap) as the public function takes them."""
    arrays = (query, key, value, attn_mask, valid_lens)
    args = sdpa_args(*_attention_standins(*arrays, out, {}), **options)
    want_lse = check_flag(return_lse, "return_lse")
    want_weights = check_flag(return_weights, "return_weights")
    if num_threads is not None:
        _threads.resolve(num_threads)  # checked now, used in the tasks
    opts = {
        "weights_out": want_weights,
        "num_threads": num_threads,
        "num_keys": args.key.shape[-2],
        "compute_dtype": args.compute_dtype,
        "is_causal": args.is_causal,
        "window": tuple(args.window),
        "scale": args.scale,
        "softcap": args.softcap,
    }
    result, lse, weights = _attention_graph("sdpa", arrays, args, _sdpa_part, opts, True)
    extra = ((lse,) if want_lse else ()) + ((weights,) if want_weights else ())
    return (result, *extra) if extra else result


def _no_weights(return_weights: object, name: str = "return_weights") -> None:
    if check_flag(return_weights, name):
        raise NotImplementedError(
            f"{name}=True is not supported here for Dask arrays: compute the weights on a "
            "slice with NumPy arrays"
        )


def _attention_graph(label, arrays: tuple, args, part, opts, split):
    """The graph of an attention call checked as ``args``, ``arrays`` its (query, key,
    value, attn_mask, valid_lens) as given: one ``part`` task per (batch, head, query, key)
    chunk; ``split``: keys chunked as given and merged (parts return
    ``(out, lse)``), else keys one chunk (parts return the output). With
    ``opts["weights_out"]`` parts also return their weights (last). Returns
    ``(out, lse or None, weights or None)``."""
    batch, nb = args.batch, len(args.batch)
    rank = nb + 3
    hq, lq, e = args.query.shape[-3:]
    hkv, lk, ev = args.key.shape[-3], args.key.shape[-2], args.value.shape[-1]
    group = hq // hkv if hkv else 1
    query, key, value, attn_mask, valid_lens = arrays
    q = _full_rank(query, batch)
    k = _full_rank(key, batch)
    v = _full_rank(value, batch)

    batch_chunks = tuple(q.chunks[:nb])
    q_heads = _group_chunks(q.chunks[nb], group)
    q_rows = q.chunks[nb + 1]
    q = _rechunk(q, batch_chunks + (q_heads, q_rows, (q.shape[-1],)))
    head_ranges = _bounds(q_heads)
    kv_starts = sorted({start // group for start, _ in head_ranges} | {hkv})
    kv_heads = tuple(b - a for a, b in itertools.pairwise(kv_starts)) or (hkv,)
    kv_index = [kv_starts.index(start // group) if hkv else 0 for start, _ in head_ranges]
    key_rows = k.chunks[nb + 1] if split else (lk,)
    k = _rechunk(k, batch_chunks + (kv_heads, key_rows, (k.shape[-1],)))
    v = _rechunk(v, batch_chunks + (kv_heads, key_rows, (ev,)))

    grid = batch_chunks + (q_heads, q_rows)  # the rows' chunks
    deps = [q, k, v]
    mask = None
    if attn_mask is not None:
        mask = _aligned(_expand(_as_dask(attn_mask), rank), grid + (key_rows,))
        deps.append(mask)
    lens = lens_host = None
    if valid_lens is not None:
        vl = _as_dask(valid_lens)
        # A prefix of the caller's rows shape: leading axes for the batch dims the caller
        # left out, trailing size-1 axes for the rest.
        vl = vl.reshape(
            (1,) * (rank - len(args.out_shape))
            + tuple(vl.shape)
            + (1,) * (len(args.out_shape) - 1 - vl.ndim)
        )
        lens = _aligned(vl, grid)
        deps.append(lens)
        if not is_dask(valid_lens):
            lens_host = np.asarray(valid_lens).reshape(lens.shape)

    compute_dtype, result_dtype = args.compute_dtype, args.result_dtype
    window = tuple(args.window)
    token = tokenize(label, q, k, v, mask, lens, opts, args.diag_offset, split)
    name = f"fastattn-{label}-{token}"
    parts_name, lse_name = f"{name}-parts", f"fastattn-{label}-lse-{token}"
    weights_name = f"fastattn-{label}-weights-{token}"
    want_weights = opts["weights_out"]
    parts, outs, lses, weights = {}, {}, {}, {}
    row_ranges = _bounds(q_rows)
    key_ranges = _bounds(key_rows)
    batch_ranges = [_bounds(c) for c in batch_chunks]
    for bi in itertools.product(*(range(len(c)) for c in batch_chunks)):
        for hi, (hs, he) in enumerate(head_ranges):
            for qi, (qs, qe) in enumerate(row_ranges):
                index = (*bi, hi, qi)
                max_len = None
                if lens_host is not None and split:
                    ranges = [*(batch_ranges[a][i] for a, i in enumerate(bi)), (hs, he), (qs, qe)]
                    block = lens_host[
                        tuple(
                            slice(None) if n == 1 else slice(*r)
                            for n, r in zip(lens_host.shape, ranges)
                        )
                    ]
                    max_len = int(block.max()) if block.size else 0
                level = []
                for ki, (ks, ke) in enumerate(key_ranges):
                    if split and _block_is_empty(
                        (qs, qe), (ks, ke), args.diag_offset, args.is_causal, window, max_len
                    ):
                        continue
                    kv = (*bi, kv_index[hi], ki)
                    node = (parts_name, *index, ki)
                    parts[node] = (
                        part,
                        (q.name, *index, 0),
                        (k.name, *kv, 0),
                        (v.name, *kv, 0),
                        None if mask is None else _block_key(mask, (*index, ki)),
                        None if lens is None else _block_key(lens, index),
                        opts,
                        ks,
                        args.diag_offset + qs - ks,
                    )
                    level.append(node)
                if not split:
                    if want_weights:
                        outs[(name, *index, 0)] = (_take, level[0], 0, result_dtype)
                        weights[(weights_name, *index, 0)] = (_take, level[0], 1, result_dtype)
                    else:
                        outs[(name, *index, 0)] = (_astype, level[0], result_dtype)
                    continue
                computed = list(level)
                if not level:  # every key masked for these rows
                    sizes = [batch_chunks[a][i] for a, i in enumerate(bi)] + [he - hs]
                    level = [(parts_name, *index, "empty")]
                    parts[level[0]] = (_empty_state, (*sizes, qe - qs, ev), compute_dtype)
                depth = 0
                while len(level) > 1:  # the merge tree
                    nxt = []
                    for j in range(0, len(level), MERGE_FANOUT):
                        node = (parts_name, *index, "merge", depth, j)
                        parts[node] = (
                            _merge_parts,
                            level[j : j + MERGE_FANOUT],
                            opts["num_threads"],
                        )
                        nxt.append(node)
                    level, depth = nxt, depth + 1
                outs[(name, *index, 0)] = (_take, level[0], 0, result_dtype)
                lses[(lse_name, *index)] = (_take, level[0], 1, compute_dtype)
                for ki, (ks, ke) in enumerate(key_ranges if want_weights else ()):
                    node = (parts_name, *index, ki)
                    if node in computed:
                        task = (_block_weights, node, level[0], result_dtype)
                    else:  # a block left out of the graph: every weight is 0
                        sizes = [batch_chunks[a][i] for a, i in enumerate(bi)] + [he - hs]
                        task = (_zeros, (*sizes, qe - qs, ke - ks), result_dtype)
                    weights[(weights_name, *index, ki)] = task

    results = [(name, outs, grid + ((ev,),), result_dtype)]
    if split:
        results.append((lse_name, lses, grid, compute_dtype))
    if want_weights:
        results.append((weights_name, weights, grid + (key_rows,), result_dtype))
    arrays = list(_arrays(parts_name, parts, deps, results))
    result = _caller_shape(arrays.pop(0), args.out_shape)
    lse = _caller_shape(arrays.pop(0), args.out_shape[:-1]) if split else None
    w = _caller_shape(arrays.pop(0), args.scores_shape) if want_weights else None
    return result, lse, w


def _caller_shape(a, shape: tuple):
    """Drop the leading size-1 axes the caller did not pass."""
    return a if tuple(a.shape) == tuple(shape) else a.reshape(shape)


# --------------------------------------------------------------------------------------
# merge_attention_states


@_block
def _merge_block(outputs: list, lses: list, num_threads: int | None):
    """merge_attention_states of NumPy blocks, on the CPU backend (CuPy blocks: refused
    by the CUDA path, which has no merge)."""
    if _cuda.uses_gpu(*outputs, *lses):
        return _cuda.merge_attention_states(outputs, lses)
    args = merge_states_args(outputs, lses)
    return _cpu.merge_attention_states(args, None, task_threads(num_threads))


@_portable
def merge_attention_states(outputs, lses, *, out=None, num_threads=None):
    outputs, lses = list(outputs), list(lses)
    named = {f"outputs[{i}]": o for i, o in enumerate(outputs)}
    named.update({f"lses[{i}]": x for i, x in enumerate(lses)})
    _require_dask(named)
    _no_out(out)
    args = merge_states_args([standin(o) for o in outputs], [standin(x) for x in lses])
    if num_threads is not None:
        _threads.resolve(num_threads)
    first = outputs[0]
    chunks = tuple(first.chunks[:-1]) + ((first.shape[-1],),)
    outputs = [_rechunk(o, chunks) for o in outputs]
    lses = [_rechunk(x, chunks[:-1]) for x in lses]
    token = tokenize(outputs, lses, num_threads)
    name, lse_name = f"fastattn-merge-{token}", f"fastattn-merge-lse-{token}"
    parts_name = f"{name}-parts"
    parts, outs, out_lses = {}, {}, {}
    for index in itertools.product(*(range(len(c)) for c in chunks[:-1])):
        node = (parts_name, *index)
        parts[node] = (
            _merge_block,
            [(o.name, *index, 0) for o in outputs],
            [(x.name, *index) for x in lses],
            num_threads,
        )
        outs[(name, *index, 0)] = (_take, node, 0, args.result_dtype)
        out_lses[(lse_name, *index)] = (_take, node, 1, args.compute_dtype)
    return _arrays(
        parts_name,
        parts,
        outputs + lses,
        [
            (name, outs, chunks, args.result_dtype),
            (lse_name, out_lses, chunks[:-1], args.compute_dtype),
        ],
    )


def _arrays(parts_name: str, parts: dict, deps: list, results: list) -> tuple:
    """Dask arrays, one per (name, tasks, chunks, dtype) of ``results``, reading one layer
    of shared tasks (so computing them together runs those once)."""
    graph = HighLevelGraph.from_collections(parts_name, parts, dependencies=deps)
    layers, dependencies = dict(graph.layers), dict(graph.dependencies)
    for layer_name, tasks, _, _ in results:
        layers[layer_name], dependencies[layer_name] = tasks, {parts_name}
    graph = HighLevelGraph(layers, dependencies)
    return tuple(
        da.Array(graph, layer_name, chunks, meta=np.empty((0,) * len(chunks), dtype))
        for layer_name, _, chunks, dtype in results
    )


# --------------------------------------------------------------------------------------
# masked_softmax


@_block
def _softmax_block(x, lens, mask, axis: int, num_threads: int | None):
    threads = task_threads(num_threads)
    if lens is not None:
        lens = np.squeeze(np.asarray(lens), axis=axis)  # back to the rows' shape
    if _cuda.uses_gpu(x):
        return _cuda.masked_softmax(x, lens, mask=mask, axis=axis, num_threads=threads)
    return _cpu.masked_softmax(masked_softmax_args(x, lens, mask, axis, None), None, threads)


@_portable
def masked_softmax(x, valid_lens=None, *, mask=None, axis=-1, out=None, num_threads=None):
    _require_dask({"x": x})
    _no_out(out)
    args = masked_softmax_args(
        standin(x), _host_or_standin(valid_lens), _host_or_standin(mask), axis, None
    )
    if num_threads is not None:
        _threads.resolve(num_threads)
    ax = args.axis
    chunks = list(x.chunks)
    chunks[ax] = (x.shape[ax],)
    chunks = tuple(chunks)
    x = _rechunk(x, chunks)
    deps = [x]
    keep = lens = None
    if mask is not None:
        keep = _aligned(_expand(_as_dask(mask), x.ndim), chunks)
        deps.append(keep)
    if valid_lens is not None:
        vl = _as_dask(valid_lens)
        rows = x.ndim - 1
        vl = vl.reshape(tuple(vl.shape) + (1,) * (rows - vl.ndim))
        lens = _aligned(da.expand_dims(vl, ax), chunks)  # the softmax axis as size 1
        deps.append(lens)
    token = tokenize(x, keep, lens, ax, num_threads)
    name = f"fastattn-softmax-{token}"
    parts_name = f"{name}-parts"
    parts, outs = {}, {}
    for index in itertools.product(*(range(len(c)) for c in chunks)):
        node = (parts_name, *index)
        parts[node] = (
            _softmax_block,
            (x.name, *index),
            None if lens is None else _block_key(lens, index),
            None if keep is None else _block_key(keep, index),
            ax,
            num_threads,
        )
        outs[(name, *index)] = (_astype, node, args.result_dtype)
    return _arrays(parts_name, parts, deps, [(name, outs, chunks, args.result_dtype)])[0]


# --------------------------------------------------------------------------------------
# attention, additive_attention: keys in one chunk, rows as chunked


@_block
def _family_part(q, k, v, mask, lens, opts: dict, key_start: int, diag: int):
    """One (batch, head, query) block of a family function over all the keys; causal and
    window as a boolean mask at the block's offset (their one-parameter form in the
    public call cannot express it)."""
    mask = _constrained(q, k, mask, diag, opts["is_causal"], opts["window"])
    return opts["block"](q, k, v, mask, lens, opts, task_threads(opts["num_threads"]))


def _additive_block(q, k, v, mask, lens, opts: dict, threads: int):
    w_q, w_k, w_v = opts["params"]
    if _cuda.uses_gpu(q):
        return _cuda.additive_attention(
            q, k, v, w_q, w_k, w_v, mask, valid_lens=lens, return_weights=opts["weights_out"]
        )
    args, ws = additive_args(q, k, v, w_q, w_k, w_v, mask, lens, False, "top_left", None)
    return _cpu.additive(args, ws, "softmax", None, opts["weights_out"], None, threads)


def _attention_block(q, k, v, mask, lens, opts: dict, threads: int):
    spec = attention_spec(
        q,
        k,
        v,
        mask,
        valid_lens=lens,
        is_causal=False,
        causal_alignment="top_left",
        window=None,
        **opts["kwargs"],
    )
    return _cpu.attention(spec, opts["weights_out"], None, threads)


def _family_graph(label, block, arrays, args, params, kwargs, return_weights, num_threads):
    """``out``, or ``(out, weights)`` when ``return_weights``; ``arrays``: the call's
    (query, key, value, attn_mask, valid_lens) as given."""
    want_weights = check_flag(return_weights, "return_weights")
    opts = {
        "block": block,
        "params": params,
        "weights_out": want_weights,
        "kwargs": kwargs,
        "num_threads": num_threads,
        "is_causal": args.is_causal,
        "window": tuple(args.window),
    }
    if num_threads is not None:
        _threads.resolve(num_threads)
    out, _, weights = _attention_graph(label, arrays, args, _family_part, opts, False)
    return (out, weights) if want_weights else out


@_portable
def additive_attention(
    query,
    key,
    value,
    attn_mask=None,
    *,
    valid_lens=None,
    return_weights=False,
    out=None,
    num_threads=None,
    **options,
):
    """The graph of an additive_attention call; ``options`` (w_q, w_k, w_v, is_causal,
    causal_alignment, window) as the public function takes them."""
    params = {name: options.pop(name) for name in ("w_q", "w_k", "w_v")}
    arrays = (query, key, value, attn_mask, valid_lens)
    q, k, v, mask, lens = _attention_standins(*arrays, out, params)
    args, _ = additive_args(q, k, v, *params.values(), mask, lens, **options)
    return _family_graph(
        "additive",
        _additive_block,
        arrays,
        args,
        tuple(params.values()),
        {},
        return_weights,
        num_threads,
    )


@_portable
def attention(
    query,
    key,
    value,
    attn_mask=None,
    *,
    valid_lens=None,
    is_causal=False,
    causal_alignment="top_left",
    window=None,
    return_weights=False,
    out=None,
    num_threads=None,
    sinks=None,
    **kwargs,
):
    if sinks is not None:
        raise NotImplementedError(
            "sinks is not supported on Dask arrays (the Dask path has no sinks): pass NumPy arrays"
        )
    params = {n: kwargs[n] for n in ("weight", "w_q", "w_k", "w_v")}
    arrays = (query, key, value, attn_mask, valid_lens)
    q, k, v, mask, lens = _attention_standins(*arrays, out, params)
    spec = attention_spec(
        q,
        k,
        v,
        mask,
        valid_lens=lens,
        is_causal=is_causal,
        causal_alignment=causal_alignment,
        window=window,
        **kwargs,
    )
    return _family_graph(
        "attention", _attention_block, arrays, spec.args, (), kwargs, return_weights, num_threads
    )


# --------------------------------------------------------------------------------------
# nadaraya_watson: batch dims and query rows chunked, keys in one chunk


@_block
def _regression_block(xq, xk, y, kwargs: dict, num_threads):
    ra = regression_args(xq, xk, y, kwargs["kernel"], kwargs["bandwidth"])
    return _cpu.nadaraya_watson(ra, False, None, task_threads(num_threads))


@_portable
def nadaraya_watson(
    x_query,
    x_keys,
    y_values,
    *,
    kernel="gaussian",
    bandwidth=1.0,
    return_weights=False,
    out=None,
    num_threads=None,
):
    _require_dask({"x_query": x_query, "x_keys": x_keys, "y_values": y_values})
    _host_params({"bandwidth": bandwidth})
    _no_out(out)
    _no_weights(return_weights)
    # Silverman's bandwidth depends on the keys' values: computed in the tasks (each sees
    # all the keys of its batch entries); the stand-ins check the rest.
    silverman = isinstance(bandwidth, str) and bandwidth == "silverman"
    ra = regression_args(
        standin(x_query),
        standin(x_keys),
        standin(y_values),
        kernel,
        1.0 if silverman else bandwidth,
    )
    if num_threads is not None:
        _threads.resolve(num_threads)
    scalar_q, scalar_y = x_query.ndim == 1, y_values.ndim == 1
    # (batch..., L, D): scalar features and values get an axis of their own
    xq = x_query[:, None] if scalar_q else x_query
    xk = x_keys[:, None] if x_keys.ndim == 1 else x_keys
    y = y_values[:, None] if scalar_y else y_values
    batch, nb = ra.batch, len(ra.batch)
    if np.ndim(bandwidth) and nb:
        raise NotImplementedError(
            "a per-batch bandwidth array with Dask arrays: give one bandwidth per call"
        )
    full = []
    for a in (xq, xk, y):
        a = _expand(a, nb + 2)
        target = batch + tuple(a.shape[-2:])
        full.append(a if tuple(a.shape) == target else da.broadcast_to(a, target))
    xq, xk, y = full
    bchunks = tuple(xq.chunks[:nb])
    xq = _rechunk(xq, bchunks + (xq.chunks[nb], (xq.shape[-1],)))
    xk = _rechunk(xk, bchunks + ((xk.shape[-2],), (xk.shape[-1],)))
    y = _rechunk(y, bchunks + ((y.shape[-2],), (y.shape[-1],)))
    kwargs = {"kernel": kernel, "bandwidth": bandwidth}
    token = tokenize(xq, xk, y, kwargs, num_threads)
    name = f"fastattn-nadaraya-watson-{token}"
    parts_name = f"{name}-parts"
    parts, outs = {}, {}
    for bi in itertools.product(*(range(len(c)) for c in bchunks)):
        for qi in range(len(xq.chunks[nb])):
            node = (parts_name, *bi, qi)
            parts[node] = (
                _regression_block,
                (xq.name, *bi, qi, 0),
                (xk.name, *bi, 0, 0),
                (y.name, *bi, 0, 0),
                kwargs,
                num_threads,
            )
            outs[(name, *bi, qi, 0)] = (_astype, node, ra.result_dtype)
    chunks = bchunks + (xq.chunks[nb], (y.shape[-1],))
    result = _arrays(parts_name, parts, [xq, xk, y], [(name, outs, chunks, ra.result_dtype)])[0]
    if scalar_y:
        result = result[..., 0]
    return _caller_shape(result, ra.out_shape)


# --------------------------------------------------------------------------------------
# MultiHeadAttention's forward pass


def _project(x, projection, dtype):
    """A layer's projection of one block of rows (row-wise: any row chunking)."""
    return projection(x.astype(dtype, copy=False))


def _projected(x, projection, features: int, dtype):
    x = _rechunk(x, x.chunks[:-1] + ((x.shape[-1],),))
    return x.map_blocks(
        _project,
        projection,
        dtype,
        chunks=x.chunks[:-1] + ((features,),),
        meta=np.empty((0, 0, 0), dtype),
    )


def _heads(x, num_heads: int):
    """``(B, L, H * D)`` -> ``(B, H, L, D)``."""
    b, length, features = x.shape
    return x.reshape(b, length, num_heads, features // num_heads).transpose(0, 2, 1, 3)


@_portable
def multihead_attention(
    layer,
    query,
    key=None,
    value=None,
    *,
    attn_mask=None,
    valid_lens=None,
    is_causal=False,
    need_weights=False,
    average_attn_weights=True,
    kv_cache=None,
    num_threads=None,
):
    """``layer(query, key, value, ...)`` on Dask arrays: the projections row-block by
    row-block, the attention by :func:`scaled_dot_product_attention`'s graph (keys may be
    chunked). No KV cache, no weights (so ``average_attn_weights`` is not read), no sinks."""
    if layer.sinks is not None:
        raise NotImplementedError(
            "a layer with sinks (use_sinks=True) is not supported on Dask arrays (the "
            "Dask path has no sinks): pass NumPy arrays"
        )
    key = query if key is None else key
    value = key if value is None else value
    _require_dask({"query": query, "key": key, "value": value})
    if kv_cache is not None:
        raise NotImplementedError("kv_cache is not supported for Dask arrays")
    _no_weights(need_weights, "need_weights")
    q_in, _, _, batched = layer_inputs(
        standin(query), standin(key), standin(value), layer.embed_dim, layer.kdim, layer.vdim
    )
    check_unbatched_mask(attn_mask, batched)
    causal = check_flag(is_causal, "is_causal")
    if is_dask(valid_lens):
        raise TypeError("valid_lens must be a NumPy array for a layer on Dask arrays")
    vl = head_valid_lens(valid_lens, q_in.shape[0], q_in.shape[1], batched)
    if not batched:
        query, key, value = query[None], key[None], value[None]
    dt = layer.dtype
    hd = layer.head_dim
    q = _heads(_projected(query, layer.q_proj, layer.num_heads * hd, dt), layer.num_heads)
    k = _heads(_projected(key, layer.k_proj, layer.num_kv_heads * hd, dt), layer.num_kv_heads)
    v = _heads(_projected(value, layer.v_proj, layer.num_kv_heads * hd, dt), layer.num_kv_heads)
    attended = scaled_dot_product_attention(
        q, k, v, attn_mask, valid_lens=vl, is_causal=causal, num_threads=num_threads
    )
    b, _, lq, _ = attended.shape
    merged = _rechunk(attended, {1: -1, 3: -1}).transpose(0, 2, 1, 3).reshape(b, lq, -1)
    out = _projected(merged, layer.out_proj, layer.embed_dim, dt)
    return out if batched else out[0]
