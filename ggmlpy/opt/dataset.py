"""ggml_opt_dataset: in-memory datasets in host memory.

The data, labels and (for weighted MSE) weights are reachable as numpy views without
copying. Shuffling permutes the rows in place, shard by shard, with a seeded numpy
generator owned by the opt context: ggml's own shuffle uses an unseedable RNG and a
private permutation that weights and multi-head label slices could not follow.
"""
from __future__ import annotations

from typing import overload

import numpy as np

from .._ffi import ffi, lib
from ..backend.buffer import Buffer
from ..backend.transfer import numpy_dtype, NUMPY_DTYPES, write_array
from ..core.args import INT64_MAX, is_int
from ..core.handle import free_handle, Handle, live, unwrap
from ..core.sysmem import check_fits_memory
from ..core.types import GGML_TYPE_F32
from ..errors import expect, GgmlStateError, GgmlTypeError, GgmlValueError
from ..graph.context import ggml_init, ggml_tensor_overhead
from ..graph.objects import as_tensor, Tensor
from ..graph.tensor import ggml_new_tensor_2d
from .context import OptContext


class Dataset(Handle):
    kind = "opt dataset"

    def __init__(self, type_data: int, type_label: int, ne_datapoint: int, ne_label: int, ndata: int,
                 ndata_shard: int) -> None:
        super().__init__(lib.ggml_opt_dataset_init(type_data, type_label, ne_datapoint, ne_label, ndata, ndata_shard),
                         lib.ggml_opt_dataset_free)
        self.ne_datapoint, self.ne_label, self.ndata, self.ndata_shard = ne_datapoint, ne_label, ndata, ndata_shard
        self._weights: Tensor | None = None
        self._weights_owned: list[Handle] = []
        for t in (self.data, self.labels):  # ggml leaves them uninitialised: a forgotten write trains on garbage
            if t is not None:
                np.frombuffer(ffi.buffer(t.ptr.data, int(lib.ggml_nbytes(t.ptr))), dtype=np.uint8)[:] = 0

    def free(self) -> None:
        super().free()
        for h in self._weights_owned:
            h.free()

    @property
    def sample_weights(self) -> Tensor | None:
        """The per-sample loss weights tensor ``[ndata]`` set with the data, or None (every weight 1)."""
        return self._weights

    @property
    def data(self) -> Tensor:
        return Tensor(lib.ggml_opt_dataset_data(self.ptr), self)

    @property
    def labels(self) -> Tensor | None:
        ptr = lib.ggml_opt_dataset_labels(self.ptr)
        return Tensor(ptr, self) if ptr != ffi.NULL else None

    @overload
    def rows(self, tensor: Tensor) -> np.ndarray: ...
    @overload
    def rows(self, tensor: None) -> None: ...
    def rows(self, tensor: Tensor | None) -> np.ndarray | None:
        """A ``(ndata, ne)`` numpy view of a host tensor of this dataset (no copy)."""
        if tensor is None:
            return None
        t = tensor.ptr
        dtype = numpy_dtype(tensor)
        flat = np.frombuffer(ffi.buffer(t.data, int(lib.ggml_nbytes(t))), dtype=dtype)
        return flat.reshape(int(t.ne[1]), int(t.ne[0]))

    def weights(self, ne0: int = 1) -> Tensor:
        if self._weights is None:
            ctx = ggml_init(2 * ggml_tensor_overhead() + 64, no_alloc=True)
            w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ne0, self.ndata)
            buf = lib.ggml_backend_alloc_ctx_tensors_from_buft(ctx.ptr, lib.ggml_backend_dev_buffer_type(
                lib.ggml_backend_dev_by_type(lib.GGML_BACKEND_DEVICE_TYPE_CPU)))
            buffer = Buffer(buf, ctx=ctx)
            self._weights_owned = [buffer, ctx]
            self._weights = Tensor(w.ptr, self)
            self.rows(self._weights)[:] = 1.0
        elif self._weights.shape[0] != ne0:
            raise GgmlValueError(f"this dataset's weights have width {self._weights.shape[0]}; cannot reuse them "
                                 f"with width {ne0}")
        return self._weights

    def shuffle(self, rng: np.random.Generator, idata: int = -1) -> None:
        shard = self.ndata_shard
        n = self.ndata if idata < 0 else idata
        n -= n % shard  # whole shards only: as in ggml, a tail that does not fill a shard stays in place
        perm = rng.permutation(n // shard)
        for arr in (self.rows(self.data), self.rows(self.labels), self.rows(self._weights)):
            if arr is not None:
                view = arr[:n].reshape(n // shard, shard * arr.shape[1])
                view[:] = view[perm]


def ggml_opt_dataset_init(type_data: int, type_label: int, ne_datapoint: int, ne_label: int, ndata: int,
                          ndata_shard: int = 1) -> Dataset:
    """An in-memory dataset: ``ndata`` datapoints of ``ne_datapoint`` values, with optional labels.

    The data live in host memory as a tensor ``[ne_datapoint, ndata]`` and the labels as
    ``[ne_label, ndata]`` (ggml layout: one column per datapoint, i.e. numpy arrays of shape
    ``(ndata, ne_datapoint)`` and ``(ndata, ne_label)``). Fill them with ``ggml_backend_tensor_set_data``
    on ``ggml_opt_dataset_data`` / ``ggml_opt_dataset_labels`` before training. ``ggml_fit_opt``,
    ``ggml_opt_fit`` and ``ggml_opt_epoch`` train on it; ``ggml_fit_opt_gen`` is the streaming
    alternative for data that does not fit in memory.

    Arguments:
        type_data: the type of the data, e.g. ``GGML_TYPE_F32`` (a plain type: F32, F16, F64, I8, I16, I32,
            I64; it must match the model's input tensor).
        type_label: the type of the labels (usually ``GGML_TYPE_F32``).
        ne_datapoint: values per datapoint (an int >= 1): the element count of one input sample.
        ne_label: values per label (an int >= 0; 0 for loss types without labels such as mean/sum).
        ndata: the number of datapoints (>= 1).
        ndata_shard: the unit of shuffling, in datapoints (default 1: every datapoint moves on its own;
            at most ``ndata``). Shuffles move whole shards; batch sizes must be multiples of it.

    Value: a Dataset handle (a context manager; freed with ``ggml_opt_dataset_free``).

    Example:
        >>> ds = ggml_opt_dataset_init(GGML_TYPE_F32, GGML_TYPE_F32, 784, 10, 60000)
        >>> ggml_backend_tensor_set_data(ggml_opt_dataset_data(ds), x_train)      # (60000, 784)
        >>> ggml_backend_tensor_set_data(ggml_opt_dataset_labels(ds), y_onehot)   # (60000, 10)
    """
    for name, t in (("type_data", type_data), ("type_label", type_label)):
        if not is_int(t) or t not in NUMPY_DTYPES:
            raise GgmlTypeError(f"ggml_opt_dataset_init: {name} must be a plain ggml type (F32, F16, I32, ...), "
                                f"got {t!r}")
    for name, v, lo in (("ne_datapoint", ne_datapoint, 1), ("ne_label", ne_label, 0), ("ndata", ndata, 1),
                        ("ndata_shard", ndata_shard, 1)):
        expect(is_int(v) and v >= lo,
               f"ggml_opt_dataset_init: {name} must be an int >= {lo}, got {v!r}")
    expect(ndata_shard <= ndata, f"ggml_opt_dataset_init: ndata_shard ({ndata_shard}) must be <= ndata ({ndata})")
    # data, labels and the shard permutation (int64 each): C++ would throw std::bad_alloc past the process
    need = ndata * (ne_datapoint * int(lib.ggml_type_size(type_data))
                    + ne_label * int(lib.ggml_type_size(type_label))) + 8 * (ndata // ndata_shard) \
        + 4 * int(lib.ggml_tensor_overhead())
    expect(ndata * max(ne_datapoint, ne_label) <= INT64_MAX,
           f"ggml_opt_dataset_init: ndata * ne_datapoint = {ndata * ne_datapoint} elements is beyond ggml's "
           "64-bit sizes")
    check_fits_memory("ggml_opt_dataset_init",
                      f"a dataset of {ndata} datapoints x ({ne_datapoint} + {ne_label}) values", need,
                      "load the data in parts (a generator source for ggml_fit) or use fewer datapoints")
    return Dataset(type_data, type_label, ne_datapoint, ne_label, ndata, ndata_shard)


def _ds(dataset: object, fn: str) -> Dataset:
    return live(dataset, Dataset, f"{fn}(dataset)")


def ggml_opt_dataset_free(dataset: Dataset) -> None:
    """Free a dataset and its data, labels and weights.

    Idempotent; its tensors raise GgmlStateError when used afterwards.

    Arguments:
        dataset: a Dataset.

    Value: None.

    Example:
        >>> ggml_opt_dataset_free(ds)
    """
    free_handle(dataset, Dataset, "ggml_opt_dataset_free(dataset)")


def ggml_opt_dataset_ndata(dataset: Dataset) -> int:
    """The number of datapoints in a dataset.

    Arguments:
        dataset: a Dataset.

    Value: an int.

    Example:
        >>> ggml_opt_dataset_ndata(ds)
        60000
    """
    return int(lib.ggml_opt_dataset_ndata(_ds(dataset, "ggml_opt_dataset_ndata").ptr))


def ggml_opt_dataset_data(dataset: Dataset) -> Tensor:
    """The dataset's data tensor ``[ne_datapoint, ndata]`` (host memory), to fill or read.

    Arguments:
        dataset: a Dataset.

    Value: a Tensor; write it with ``ggml_backend_tensor_set_data`` (a numpy array of shape
    ``(ndata, ne_datapoint)`` is already in ggml layout).

    Example:
        >>> ggml_backend_tensor_set_data(ggml_opt_dataset_data(ds), x_train)
    """
    return _ds(dataset, "ggml_opt_dataset_data").data


def ggml_opt_dataset_labels(dataset: Dataset) -> Tensor | None:
    """The dataset's labels tensor ``[ne_label, ndata]``, or None when ``ne_label`` is 0.

    Arguments:
        dataset: a Dataset.

    Value: a Tensor or None; write it with ``ggml_backend_tensor_set_data`` (numpy shape
    ``(ndata, ne_label)``).

    Example:
        >>> ggml_backend_tensor_set_data(ggml_opt_dataset_labels(ds), np.eye(10)[y_train])
    """
    return _ds(dataset, "ggml_opt_dataset_labels").labels


def ggml_opt_dataset_weights(dataset: Dataset, ne0: int = 1) -> Tensor:
    """The per-datapoint (``ne0 = 1``) or per-element (``ne0 = ne_label``) weights of weighted MSE.

    Created on first use with every weight 1; shuffles move them with their datapoints. Used by
    ``ggml_fit_opt`` with ``ggml_opt_loss_type_weighted_mse()``.

    Arguments:
        dataset: a Dataset.
        ne0: the width of each weight row: 1 (the default, one weight per datapoint) or ``ne_label``
            (one per label element, a mask). Once created, the width cannot change.

    Value: an F32 Tensor ``[ne0, ndata]`` in host memory, to fill with ``ggml_backend_tensor_set_data``.

    Example:
        >>> ggml_backend_tensor_set_data(ggml_opt_dataset_weights(ds), sample_weights)   # (ndata,)
    """
    ds = _ds(dataset, "ggml_opt_dataset_weights")
    expect(is_int(ne0) and ne0 in (1, ds.ne_label),
           f"ggml_opt_dataset_weights: ne0 must be 1 or ne_label ({ds.ne_label}), got {ne0!r}")
    return ds.weights(ne0)


def ggml_opt_dataset_shuffle(opt_ctx: OptContext, dataset: Dataset, idata: int = -1) -> None:
    """Shuffle the first ``idata`` datapoints of a dataset in place, shard by shard.

    Data, labels and weights move together. The random generator belongs to the opt context (seeded
    the same way for every new context), so runs are reproducible.

    Arguments:
        opt_ctx: an opt context (its generator is used).
        dataset: the Dataset to shuffle.
        idata: how many leading datapoints to shuffle; negative (the default, -1) shuffles all whole
            shards. Otherwise at most ``ndata`` and a multiple of ``ndata_shard``.

    Value: None.

    Example:
        >>> ggml_opt_dataset_shuffle(opt_ctx, ds)
    """
    unwrap(opt_ctx, OptContext, "ggml_opt_dataset_shuffle(opt_ctx)")
    ds = _ds(dataset, "ggml_opt_dataset_shuffle")
    expect(is_int(idata), f"idata must be an int, got {idata!r}")
    if idata >= 0 and (idata > ds.ndata or idata % ds.ndata_shard):
        raise GgmlValueError(f"ggml_opt_dataset_shuffle: idata must be <= ndata ({ds.ndata}) and a multiple of "
                             f"ndata_shard ({ds.ndata_shard}), got {idata}")
    ds.shuffle(opt_ctx.rng, idata)


def datapoints_of(t: Tensor, width: int, what: str, flat_ok: bool = False) -> int:
    """How many datapoints of ``width`` values a batch tensor holds, from its shape: its outermost axis longer
    than 1 is the batch (``[width, batch]``, ``[W, H, C, batch]``), the axes inside it one datapoint. Element
    counts alone would take a ``[3, 4]`` tensor for 2 datapoints of 6, each made of parts of two rows.
    ``flat_ok``: a 1-D tensor of ``batch * width`` values also holds ``batch`` datapoints, one after the
    other (ggml's own tests read dataset batches into such tensors)."""
    ne = [int(n) for n in t.shape]
    if t.nelements() == width:
        return 1
    if flat_ok and all(n == 1 for n in ne[1:]) and width > 0 and ne[0] % width == 0:
        return ne[0] // width
    outer = max((k for k, n in enumerate(ne) if n > 1), default=0)
    per_point = t.nelements() // ne[outer]
    if per_point != width:
        raise GgmlValueError(f"{what} (ne {ne}) holds datapoints of {per_point} values (every axis but its outermost, "
                             f"the batch of {ne[outer]}), the dataset's have {width} (its ne_datapoint or "
                             f"ne_label); make it [{width}, batch] (or "
                             f"[W, H, C, batch] for images of W*H*C = {width} values)")
    return ne[outer]


def _check_batch_tensor(fn: str, ds: Dataset, host: np.ndarray, t: Tensor, ibatch: int, what: str,
                        width: int | None = None) -> int:
    width = host.shape[1] if width is None else width
    if t.type != _type_of(host) or not lib.ggml_is_contiguous(t.ptr):
        raise GgmlTypeError(f"{fn}: {what} must be a contiguous tensor of the dataset's type")
    batch = datapoints_of(t, width, f"{fn}: {what}", flat_ok=True)
    if batch % ds.ndata_shard:
        raise GgmlValueError(f"{fn}: the batch size {batch} must be a multiple of ndata_shard ({ds.ndata_shard})")
    nbatches = ds.ndata // batch
    if not is_int(ibatch) or not 0 <= ibatch < nbatches:
        raise GgmlValueError(f"{fn}: ibatch must be in [0, {nbatches}) for batches of {batch}, got {ibatch!r}")
    if t.ptr.data == ffi.NULL:
        raise GgmlStateError(f"{fn}: {what} is not allocated")
    return batch


def _type_of(arr: np.ndarray) -> int:
    return next(k for k, v in NUMPY_DTYPES.items() if v == arr.dtype)


def ggml_opt_dataset_get_batch(dataset: Dataset, data_batch: Tensor, labels_batch: Tensor | None = None,
                               ibatch: int = 0) -> None:
    """Copy batch ``ibatch`` of the dataset into the batch tensors of a model.

    The batch size is read from ``data_batch``'s shape: its outermost axis longer than 1, the axes inside
    it one datapoint of ``ne_datapoint`` values, or a 1-D tensor of ``batch * ne_datapoint`` values (as
    ggml's tests use); a multi-axis tensor of the right element count but another layout is refused. Batch
    ``ibatch`` is the datapoints ``[ibatch * batch, (ibatch + 1) * batch)`` in the dataset's current
    (possibly shuffled) order.

    Arguments:
        dataset: a Dataset.
        data_batch: an allocated, contiguous tensor of the dataset's data type holding a whole number
            of datapoints (a multiple of ``ndata_shard``), e.g. the model's input ``[ne_datapoint, batch]``.
        labels_batch: the labels tensor ``[ne_label, batch]``; required exactly when the dataset has
            labels (default None).
        ibatch: the 0-based batch index, in ``[0, ndata // batch)`` (default 0).

    Value: None. Raises GgmlValueError / GgmlTypeError when a tensor does not fit.

    Example:
        >>> for i in range(ggml_opt_dataset_ndata(ds) // 32):
        ...     ggml_opt_dataset_get_batch(ds, x, y, i)
    """
    fn = "ggml_opt_dataset_get_batch"
    ds = _ds(dataset, fn)
    data = as_tensor(data_batch, f"{fn}(data_batch)")
    batch = _check_batch_tensor(fn, ds, ds.rows(ds.data), data, ibatch, "data_batch")
    rows = slice(ibatch * batch, (ibatch + 1) * batch)
    write_array(data.ptr, ds.rows(ds.data)[rows])
    labels = ds.labels
    if (labels is None) != (labels_batch is None):
        raise GgmlValueError(f"{fn}: labels_batch must be given exactly when the dataset has labels")
    if labels_batch is not None and labels is not None:  # both or neither (checked above)
        lt = as_tensor(labels_batch, f"{fn}(labels_batch)")
        if _check_batch_tensor(fn, ds, ds.rows(labels), lt, ibatch, "labels_batch") != batch:
            raise GgmlValueError(f"{fn}: data_batch and labels_batch hold different numbers of datapoints")
        write_array(lt.ptr, ds.rows(labels)[rows])


def ggml_opt_dataset_get_batch_head(dataset: Dataset, data_batch: Tensor | None, labels_batch: Tensor,
                                    labels_off: int, ibatch: int) -> None:
    """Like ``ggml_opt_dataset_get_batch``, but only the label columns of one output head.

    For multi-head models whose labels sit side by side in each label row: copies the label columns
    ``[labels_off, labels_off + labels_batch.ne[0])`` of batch ``ibatch`` into ``labels_batch``.

    Arguments:
        dataset: a Dataset with labels.
        data_batch: the input tensor to fill as well, or None to copy labels only.
        labels_batch: the head's label tensor ``[width, batch]``.
        labels_off: the 0-based first label column of this head.
        ibatch: the 0-based batch index.

    Value: None.

    Example:
        >>> ggml_opt_dataset_get_batch_head(ds, None, y_head2, 10, i)   # label columns 10.. of batch i
    """
    fn = "ggml_opt_dataset_get_batch_head"
    ds = _ds(dataset, fn)
    labels = ds.labels
    if labels is None:
        raise GgmlValueError(f"{fn}: the dataset has no labels")
    lt = as_tensor(labels_batch, f"{fn}(labels_batch)")
    host = ds.rows(labels)
    width = lt.shape[0]
    expect(is_int(labels_off) and 0 <= labels_off and labels_off + width <= ds.ne_label,
           f"{fn}: labels [{labels_off!r}, {labels_off!r}+{width}) fall outside the dataset's {ds.ne_label} "
           "label columns")
    batch = _check_batch_tensor(fn, ds, host, lt, ibatch, "labels_batch", width)
    rows = slice(ibatch * batch, (ibatch + 1) * batch)
    if data_batch is not None:
        data = as_tensor(data_batch, f"{fn}(data_batch)")
        if _check_batch_tensor(fn, ds, ds.rows(ds.data), data, ibatch, "data_batch") != batch:
            raise GgmlValueError(f"{fn}: data_batch and labels_batch hold different numbers of datapoints")
    write_array(lt.ptr, np.ascontiguousarray(host[rows, labels_off:labels_off + width]))
    if data_batch is not None:
        ggml_opt_dataset_get_batch_rows(ds, data_batch, rows)


def ggml_opt_dataset_get_batch_rows(ds: Dataset, data_batch: Tensor, rows: slice) -> None:
    """Copy the data of the datapoints ``rows`` (a slice) into ``data_batch``.

    A lower-level helper of ``ggml_opt_dataset_get_batch_head``: no batch arithmetic, only a type and
    size check.

    Arguments:
        ds: a Dataset.
        data_batch: a contiguous tensor of the dataset's data type with exactly as many elements as
            the selected rows hold.
        rows: a slice of datapoint indices, e.g. ``slice(64, 96)``.

    Value: None.

    Example:
        >>> ggml_opt_dataset_get_batch_rows(ds, x, slice(0, 32))
    """
    fn = "ggml_opt_dataset_get_batch_rows"
    _ds(ds, fn)
    data = as_tensor(data_batch, f"{fn}(data_batch)")
    if not isinstance(rows, slice) or not all(v is None or (is_int(v))
                                              for v in (rows.start, rows.stop, rows.step)):
        raise GgmlTypeError(f"{fn}: rows must be a slice of ints (e.g. slice(0, 32)), got {rows!r}")
    if rows.step not in (None, 1):
        raise GgmlValueError(f"{fn}: rows must be a slice with step 1, got {rows!r}")
    start, stop, _ = rows.indices(ds.ndata)
    src = ds.rows(ds.data)[start:stop]
    if data.type != _type_of(src) or not lib.ggml_is_contiguous(data.ptr):
        raise GgmlTypeError("ggml_opt_dataset_get_batch_rows: data_batch must be a contiguous tensor of the "
                            f"dataset's type ({src.dtype})")
    if datapoints_of(data, ds.ne_datapoint, f"{fn}: data_batch") != stop - start:
        raise GgmlValueError(f"{fn}: data_batch holds {data.nelements() // ds.ne_datapoint} datapoints, the rows "
                             f"{start}:{stop} are {stop - start}")
    write_array(data.ptr, src)


def not_distributions(rows: np.ndarray) -> np.ndarray:
    """The rule for cross-entropy targets, one row per prediction: a row is a distribution over the classes
    when its values are >= 0 and not all zero (a row of zeros trained to loss 0, a negative value to a
    negative loss, silently). Returns the mask of rows that are not."""
    return ~(rows >= 0).all(axis=1) | ~(rows.sum(axis=1) > 0)


def all_distributions(rows: np.ndarray) -> bool:
    """``not_distributions(rows)`` finds none (the per-batch check's common case, in a few vectorised passes: no
    value below 0 or NaN, no row summing to 0; rows of many classes sum as fast as rows of few)."""
    if rows.shape[0] == 0:
        return True
    return bool(rows.size and rows.min() >= 0 and np.einsum("ij->i", rows).min() > 0)


def check_distribution_rows(ds: Dataset, fn: str) -> None:
    """The labels of a dataset a cross-entropy trains on follow ``not_distributions``' rule."""
    rows = ds.rows(ds.labels)
    if rows is None or not rows.size or all_distributions(rows):
        return
    bad = not_distributions(rows)
    if bad.any():
        k = int(np.argmax(bad))
        raise GgmlValueError(f"{fn}: the dataset's labels are the targets of a cross-entropy, one distribution over "
                             f"the classes per datapoint; datapoint {k} has {rows[k].tolist()[:8]}: every value must "
                             f"be >= 0 and a row must not be all zeros ({int(bad.sum())} rows of {len(rows)} are not)")
