/* BatchRows: a batch's rows (lists, token rows, arrays, the id index, dicts
 * keyed by row, the swap record) permuted together in one call; what
 * vllm_seqhooks.engine.vllm_private.input_batch does with numpy and Python
 * otherwise. */

#include "moves.h"

PyDoc_STRVAR(batch_rows_doc,
"BatchRows(lists, token_rows, whole_rows, counts, index, keys, dicts=())\n\n"
"The rows of one batch, permuted together: `lists` (lists with one item\n"
"per row), `token_rows` (2-D buffers of one token row per row: only each\n"
"permutation's active prefix moves), `whole_rows` (buffers whose rows move\n"
"whole: 1-D, or 2-D with contiguous rows), `counts` (a 1-D int32 or int64\n"
"buffer: each row's tokens, what the active prefix is read from) and\n"
"`index` (a dict: keys[r] -> r for the rows that move; `keys` is one of\n"
"`lists`); `dicts`: dicts keyed by row that hold entries for some rows (a\n"
"moved row's entry moves with it; where it had none, none is left). Keeps\n"
"the buffers open while it lives.");

typedef struct {
    PyObject_HEAD
    PyObject *lists;
    PyObject *index;
    PyObject *keys;
    PyObject *dicts;
    Py_ssize_t n_token, n_rows, min_rows;
    Rows *rows; /* the token rows (nbytes: one token), then the whole rows */
    Py_buffer counts;
    int counts_open;
} BatchRows;

static void batch_rows_dealloc(BatchRows *self) {
    for (Py_ssize_t t = 0; self->rows != NULL && t < self->n_rows; t++)
        PyBuffer_Release(&self->rows[t].view);
    PyMem_Free(self->rows);
    if (self->counts_open)
        PyBuffer_Release(&self->counts);
    Py_XDECREF(self->lists);
    Py_XDECREF(self->index);
    Py_XDECREF(self->keys);
    Py_XDECREF(self->dicts);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Open `spec` (a buffer, or (buffer, bytes per row) when `whole`) into
 * rows[at]; for token rows, nbytes is one token's. */
static int open_buffer(BatchRows *self, PyObject *spec, int whole) {
    Rows *r = &self->rows[self->n_rows];
    PyObject *obj = spec;
    if (PyObject_GetBuffer(obj, &r->view, PyBUF_STRIDES | PyBUF_WRITABLE) < 0)
        return -1;
    Py_buffer *v = &r->view;
    if (v->ndim < 1 || v->ndim > 2 || (v->ndim == 2 && v->strides[1] != v->itemsize) ||
        (!whole && v->ndim != 2)) {
        PyBuffer_Release(v);
        PyErr_SetString(PyExc_ValueError,
                        "token rows are 2-D with contiguous rows; whole rows 1-D or that");
        return -1;
    }
    r->nbytes = whole ? v->itemsize * (v->ndim == 2 ? v->shape[1] : 1) : v->itemsize;
    if (self->n_rows == 0 || v->shape[0] < self->min_rows)
        self->min_rows = v->shape[0];
    self->n_rows++;
    return 0;
}

static PyObject *batch_rows_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"lists", "token_rows", "whole_rows", "counts", "index", "keys",
                            "dicts", NULL};
    PyObject *lists, *token_rows, *whole_rows, *counts, *index, *keys, *dicts = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!OO!O!|O!", names, &PyTuple_Type,
                                     &lists, &PyTuple_Type, &token_rows, &PyTuple_Type,
                                     &whole_rows, &counts, &PyDict_Type, &index, &PyList_Type,
                                     &keys, &PyTuple_Type, &dicts))
        return NULL;
    for (Py_ssize_t t = 0; dicts != NULL && t < PyTuple_GET_SIZE(dicts); t++) {
        if (!PyDict_Check(PyTuple_GET_ITEM(dicts, t))) {
            PyErr_SetString(PyExc_TypeError, "dicts must be dicts");
            return NULL;
        }
    }
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(lists); t++) {
        if (!PyList_Check(PyTuple_GET_ITEM(lists, t))) {
            PyErr_SetString(PyExc_TypeError, "lists must be lists");
            return NULL;
        }
    }
    BatchRows *self = (BatchRows *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->lists = Py_NewRef(lists);
    self->index = Py_NewRef(index);
    self->keys = Py_NewRef(keys);
    self->dicts = dicts ? Py_NewRef(dicts) : PyTuple_New(0);
    if (self->dicts == NULL)
        goto fail;
    self->n_token = PyTuple_GET_SIZE(token_rows);
    Py_ssize_t total = self->n_token + PyTuple_GET_SIZE(whole_rows);
    self->rows = PyMem_Calloc(total ? total : 1, sizeof(Rows));
    if (self->rows == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t t = 0; t < total; t++) {
        int whole = t >= self->n_token;
        PyObject *spec = whole ? PyTuple_GET_ITEM(whole_rows, t - self->n_token)
                               : PyTuple_GET_ITEM(token_rows, t);
        if (open_buffer(self, spec, whole) < 0)
            goto fail;
    }
    if (PyObject_GetBuffer(counts, &self->counts, PyBUF_STRIDES | PyBUF_FORMAT) < 0)
        goto fail;
    self->counts_open = 1;
    const char *f = self->counts.format ? self->counts.format : "B";
    char kind = f[(f[0] == '=' || f[0] == '<' || f[0] == '@')];
    if (self->counts.ndim != 1 || !((kind == 'i' && self->counts.itemsize == 4) ||
                                    ((kind == 'l' || kind == 'q') && self->counts.itemsize == 8))) {
        PyErr_SetString(PyExc_TypeError, "counts are a 1-D int32 or int64 buffer");
        goto fail;
    }
    if (self->n_rows == 0 || self->counts.shape[0] < self->min_rows)
        self->min_rows = self->counts.shape[0];
    return (PyObject *)self;
fail:
    Py_DECREF(self);
    return NULL;
}

static long long count_at(const Py_buffer *counts, Py_ssize_t row) {
    const char *at = (const char *)counts->buf + row * counts->strides[0];
    return counts->itemsize == 4 ? *(const int *)at : *(const long long *)at;
}

PyDoc_STRVAR(batch_rows_permute_doc,
"permute(dst, src, extra_tokens, moved=None, tag=None)\n\n"
"Row dst[k] takes what row src[k] held (the moves must permute one set of\n"
"rows): in each list; in each token buffer, the first max(counts[src]) +\n"
"extra_tokens tokens; in each whole-row buffer, the whole row. Then\n"
"index[keys[r]] = r for each r in dst; each dict's entries move with their\n"
"rows; and when `moved` is a list, the\n"
"moves as pairwise swaps (i, j, tag) are appended to it, one fewer than the\n"
"rows of each cycle (vllm_seqhooks.core.batch_order.moves_as_swaps).\n"
"Nothing changes when an argument is refused.");

/* Row dst[k] of `dict` takes row src[k]'s entry, or none. */
static int permute_dict(PyObject *dict, PyObject *dst, PyObject *src, Py_ssize_t n) {
    if (PyDict_GET_SIZE(dict) == 0)
        return 0;
    PyObject **taken = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    if (taken == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = 0;
    for (Py_ssize_t k = 0; k < n && rc == 0; k++) {
        taken[k] = Py_XNewRef(PyDict_GetItemWithError(dict, PyList_GET_ITEM(src, k)));
        rc = taken[k] == NULL && PyErr_Occurred() ? -1 : 0;
    }
    for (Py_ssize_t k = 0; k < n && rc == 0; k++) {
        PyObject *row = PyList_GET_ITEM(dst, k);
        if (taken[k] != NULL)
            rc = PyDict_SetItem(dict, row, taken[k]);
        else if (PyDict_Contains(dict, row) == 1)
            rc = PyDict_DelItem(dict, row);
    }
    for (Py_ssize_t k = 0; k < n; k++)
        Py_XDECREF(taken[k]);
    PyMem_Free(taken);
    return rc;
}

/* The rows every list holds (they may change length between calls). */
static Py_ssize_t rows_held(const BatchRows *self) {
    Py_ssize_t shortest = self->min_rows;
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(self->lists); t++)
        if (PyList_GET_SIZE(PyTuple_GET_ITEM(self->lists, t)) < shortest)
            shortest = PyList_GET_SIZE(PyTuple_GET_ITEM(self->lists, t));
    if (PyList_GET_SIZE(self->keys) < shortest)
        shortest = PyList_GET_SIZE(self->keys);
    return shortest;
}

/* Check the moves against the batch; *width: the tokens each token row
 * moves; *widest: the most bytes a row moves. 0, or -1 with an exception. */
static int check_moves(const BatchRows *self, const Moves *m, Py_ssize_t extra,
                       Py_ssize_t *width, Py_ssize_t *widest) {
    Py_ssize_t held = rows_held(self);
    long long most = 0;
    for (Py_ssize_t k = 0; k < m->n; k++) {
        if (m->dst[k] >= held) {
            PyErr_Format(PyExc_IndexError, "row %zd: the batch holds %zd", m->dst[k], held);
            return -1;
        }
        long long c = count_at(&self->counts, m->src[k]);
        if (k == 0 || c > most)
            most = c;
    }
    *width = (Py_ssize_t)(most + extra);
    *widest = 1;
    for (Py_ssize_t t = 0; t < self->n_rows; t++) {
        const Rows *r = &self->rows[t];
        Py_ssize_t row_bytes = r->view.itemsize * (r->view.ndim == 2 ? r->view.shape[1] : 1);
        Py_ssize_t nbytes = t < self->n_token ? *width * r->nbytes : r->nbytes;
        if (nbytes < 0 || nbytes > row_bytes) {
            PyErr_Format(PyExc_ValueError, "%zd tokens, rows hold %zd", *width,
                         row_bytes / r->view.itemsize);
            return -1;
        }
        if (nbytes > *widest)
            *widest = nbytes;
    }
    return 0;
}

/* Append the moves as pairwise swaps (i, j, tag): 0, or -1. */
static int append_swaps(PyObject *moved, const Moves *m, PyObject *tag) {
    for (Py_ssize_t i = 0; i + 1 < m->cycles_len; i++) {
        if (m->cycles[i] < 0 || m->cycles[i + 1] < 0)
            continue;
        PyObject *rec = Py_BuildValue("(nnO)", m->cycles[i], m->cycles[i + 1], tag);
        int failed = rec == NULL || PyList_Append(moved, rec) < 0;
        Py_XDECREF(rec);
        if (failed)
            return -1;
    }
    return 0;
}

static PyObject *batch_rows_permute(BatchRows *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"dst", "src", "extra_tokens", "moved", "tag", NULL};
    PyObject *dst, *src, *moved = Py_None, *tag = Py_None;
    Py_ssize_t extra, width, widest;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!n|OO", names, &PyList_Type, &dst,
                                     &PyList_Type, &src, &extra, &moved, &tag))
        return NULL;
    if (moved != Py_None && !PyList_Check(moved)) {
        PyErr_SetString(PyExc_TypeError, "moved is a list or None");
        return NULL;
    }
    Moves m;
    if (seqhooks_read_moves(dst, src, &m) < 0)
        return NULL;
    PyObject *result = NULL;
    char *tmp = NULL;
    if (check_moves(self, &m, extra, &width, &widest) < 0)
        goto done;
    if ((tmp = PyMem_Malloc(widest)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(self->lists); t++)
        seqhooks_permute_items(PyTuple_GET_ITEM(self->lists, t), &m);
    for (Py_ssize_t t = 0; t < self->n_rows; t++) {
        Rows r = self->rows[t];
        if (t < self->n_token)
            r.nbytes *= width;
        seqhooks_permute_rows(&r, &m, tmp);
    }
    for (Py_ssize_t k = 0; k < m.n; k++)
        if (PyDict_SetItem(self->index, PyList_GET_ITEM(self->keys, m.dst[k]),
                           PyList_GET_ITEM(dst, k)) < 0)
            goto done;
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(self->dicts); t++)
        if (permute_dict(PyTuple_GET_ITEM(self->dicts, t), dst, src, m.n) < 0)
            goto done;
    if (moved != Py_None && append_swaps(moved, &m, tag) < 0)
        goto done;
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(tmp);
    seqhooks_free_moves(&m);
    return result;
}

static PyMethodDef batch_rows_methods[] = {
    {"permute", (PyCFunction)(void (*)(void))batch_rows_permute, METH_VARARGS | METH_KEYWORDS,
     batch_rows_permute_doc},
    {NULL, NULL, 0, NULL},
};

PyTypeObject SeqhooksBatchRowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "vllm_seqhooks.native._rows.BatchRows",
    .tp_basicsize = sizeof(BatchRows),
    .tp_dealloc = (destructor)batch_rows_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = batch_rows_doc,
    .tp_methods = batch_rows_methods,
    .tp_new = batch_rows_new,
};

