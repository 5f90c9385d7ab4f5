/* Compiled kernels of the family batch order: the grouping decision
 * (vllm_seqhooks.core.batch_order) and moving rows of a batch's buffers and
 * lists (vllm_seqhooks.engine.vllm_private.input_batch). Each function does
 * what the pure-Python implementation named in its docstring does;
 * tests/test_native.py compares them on random inputs. Nothing here knows
 * vLLM: callers hand over lists, dicts and buffers.
 *
 * A "move" is a pair of equal-length lists of row indices (dst, src): row
 * dst[k] takes what row src[k] held. Every function that applies moves
 * first checks that they are a permutation of one set of rows. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Families (codes) the grouping decision accepts: 0 <= code < MAX_CODE;
 * rows the moves may name: 0 <= row < MAX_ROWS. */
#define MAX_CODE (1 << 24)
#define MAX_ROWS (1 << 24)

/* ------------------------------------------------------------ helpers */

/* The ints of a list, as C integers in [0, limit). NULL on error. */
static Py_ssize_t *read_rows(PyObject *list, Py_ssize_t limit, const char *what) {
    Py_ssize_t n = PyList_GET_SIZE(list);
    Py_ssize_t *out = PyMem_Malloc(sizeof(Py_ssize_t) * (n ? n : 1));
    if (out == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t v = PyLong_AsSsize_t(PyList_GET_ITEM(list, k));
        if (v == -1 && PyErr_Occurred()) {
            PyMem_Free(out);
            return NULL;
        }
        if (v < 0 || v >= limit) {
            PyErr_Format(PyExc_IndexError, "%s %zd outside [0, %zd)", what, v, limit);
            PyMem_Free(out);
            return NULL;
        }
        out[k] = v;
    }
    return out;
}

/* Moves read and checked: equal lengths, each side without repeats, the
 * same set of rows on both sides. `cycles` lists the permutation's cycles,
 * each as s, a, b, ..., z, -1: row s takes row a's content, a takes b's,
 * ..., z takes s's. A row that takes its own content is in no cycle. */
typedef struct {
    Py_ssize_t n;
    Py_ssize_t *dst;
    Py_ssize_t *src;
    Py_ssize_t *cycles;
    Py_ssize_t cycles_len;
} Moves;

static void free_moves(Moves *m) {
    PyMem_Free(m->dst);
    PyMem_Free(m->src);
    PyMem_Free(m->cycles);
    m->dst = m->src = m->cycles = NULL;
}

static int read_moves(PyObject *dst, PyObject *src, Moves *m) {
    m->dst = m->src = m->cycles = NULL;
    m->cycles_len = 0;
    m->n = PyList_GET_SIZE(dst);
    if (PyList_GET_SIZE(src) != m->n) {
        PyErr_SetString(PyExc_ValueError, "dst and src differ in length");
        return -1;
    }
    m->dst = read_rows(dst, MAX_ROWS, "dst row");
    if (m->dst == NULL)
        return -1;
    m->src = read_rows(src, MAX_ROWS, "src row");
    if (m->src == NULL) {
        free_moves(m);
        return -1;
    }
    Py_ssize_t rows = 0;
    for (Py_ssize_t k = 0; k < m->n; k++)
        if (m->dst[k] >= rows)
            rows = m->dst[k] + 1;
    /* takes[r]: the row whose content row r takes, -1 for rows not moved;
     * the dst rows are distinct, the src rows distinct and among them */
    Py_ssize_t *takes = PyMem_Malloc(sizeof(Py_ssize_t) * (rows ? rows : 1));
    unsigned char *given = PyMem_Calloc(rows ? rows : 1, 1);
    m->cycles = PyMem_Malloc(sizeof(Py_ssize_t) * (2 * m->n + 1));
    if (takes == NULL || given == NULL || m->cycles == NULL) {
        PyMem_Free(takes);
        PyMem_Free(given);
        free_moves(m);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t r = 0; r < rows; r++)
        takes[r] = -1;
    int ok = 1;
    for (Py_ssize_t k = 0; k < m->n && ok; k++) {
        ok = takes[m->dst[k]] < 0;
        takes[m->dst[k]] = m->src[k];
    }
    for (Py_ssize_t k = 0; k < m->n && ok; k++) {
        Py_ssize_t r = m->src[k];
        ok = r < rows && takes[r] >= 0 && !given[r];
        if (ok)
            given[r] = 1;
    }
    PyMem_Free(given);
    if (!ok) {
        PyMem_Free(takes);
        free_moves(m);
        PyErr_SetString(PyExc_ValueError, "moves are not a permutation of one set of rows");
        return -1;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t k = 0; k < m->n; k++) {
        Py_ssize_t start = m->dst[k];
        if (takes[start] < 0)
            continue;
        if (takes[start] == start) {
            takes[start] = -1;
            continue;
        }
        for (Py_ssize_t r = start; takes[r] >= 0;) {
            Py_ssize_t next = takes[r];
            m->cycles[at++] = r;
            takes[r] = -1;
            r = next;
        }
        m->cycles[at++] = -1;
    }
    m->cycles_len = at;
    PyMem_Free(takes);
    return 0;
}

/* ------------------------------------------------------------ permute */

/* A buffer whose rows move: its first `nbytes` bytes of each row. */
typedef struct {
    Py_buffer view;
    Py_ssize_t nbytes;
} Rows;

/* Move the rows along each cycle, through one row's worth of `tmp`. */
static void permute_rows(const Rows *rows, const Moves *m, char *tmp) {
    char *base = rows->view.buf;
    Py_ssize_t stride = rows->view.strides[0], nbytes = rows->nbytes;
    const Py_ssize_t *c = m->cycles;
    for (Py_ssize_t i = 0; i < m->cycles_len; i++) {
        Py_ssize_t row = c[i];
        memcpy(tmp, base + row * stride, nbytes);
        for (; c[i + 1] >= 0; i++, row = c[i])
            memcpy(base + row * stride, base + c[i + 1] * stride, nbytes);
        memcpy(base + row * stride, tmp, nbytes);
        i++; /* past the cycle's -1 */
    }
}

/* The items only change places (the moves permute one set of rows), so no
 * reference count changes. */
static void permute_items(PyObject *list, const Moves *m) {
    PyObject **items = ((PyListObject *)list)->ob_item;
    const Py_ssize_t *c = m->cycles;
    for (Py_ssize_t i = 0; i < m->cycles_len; i++) {
        Py_ssize_t row = c[i];
        PyObject *first = items[row];
        for (; c[i + 1] >= 0; i++, row = c[i])
            items[row] = items[c[i + 1]];
        items[row] = first;
        i++;
    }
}

/* ------------------------------------------------------------ a batch */

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

static PyObject *batch_rows_permute(BatchRows *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"dst", "src", "extra_tokens", "moved", "tag", NULL};
    PyObject *dst, *src, *moved = Py_None, *tag = Py_None;
    Py_ssize_t extra;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!n|OO", names, &PyList_Type, &dst,
                                     &PyList_Type, &src, &extra, &moved, &tag))
        return NULL;
    if (moved != Py_None && !PyList_Check(moved)) {
        PyErr_SetString(PyExc_TypeError, "moved is a list or None");
        return NULL;
    }
    Moves m;
    if (read_moves(dst, src, &m) < 0)
        return NULL;
    PyObject *result = NULL;
    char *tmp = NULL;
    Py_ssize_t shortest = self->min_rows;
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(self->lists); t++)
        if (PyList_GET_SIZE(PyTuple_GET_ITEM(self->lists, t)) < shortest)
            shortest = PyList_GET_SIZE(PyTuple_GET_ITEM(self->lists, t));
    if (PyList_GET_SIZE(self->keys) < shortest)
        shortest = PyList_GET_SIZE(self->keys);
    long long width = 0;
    for (Py_ssize_t k = 0; k < m.n; k++) {
        if (m.dst[k] >= shortest) {
            PyErr_Format(PyExc_IndexError, "row %zd: the batch holds %zd", m.dst[k], shortest);
            goto done;
        }
        long long c = count_at(&self->counts, m.src[k]);
        if (k == 0 || c > width)
            width = c;
    }
    width += extra;
    Py_ssize_t widest = 1;
    for (Py_ssize_t t = 0; t < self->n_rows; t++) {
        const Rows *r = &self->rows[t];
        Py_ssize_t row_bytes = r->view.itemsize * (r->view.ndim == 2 ? r->view.shape[1] : 1);
        Py_ssize_t nbytes = t < self->n_token ? (Py_ssize_t)width * r->nbytes : r->nbytes;
        if (nbytes < 0 || nbytes > row_bytes) {
            PyErr_Format(PyExc_ValueError, "%lld tokens, rows hold %zd", width,
                         row_bytes / r->view.itemsize);
            goto done;
        }
        if (nbytes > widest)
            widest = nbytes;
    }
    tmp = PyMem_Malloc(widest);
    if (tmp == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(self->lists); t++)
        permute_items(PyTuple_GET_ITEM(self->lists, t), &m);
    for (Py_ssize_t t = 0; t < self->n_rows; t++) {
        Rows r = self->rows[t];
        if (t < self->n_token)
            r.nbytes *= (Py_ssize_t)width;
        permute_rows(&r, &m, tmp);
    }
    for (Py_ssize_t k = 0; k < m.n; k++)
        if (PyDict_SetItem(self->index, PyList_GET_ITEM(self->keys, m.dst[k]),
                           PyList_GET_ITEM(dst, k)) < 0)
            goto done;
    for (Py_ssize_t t = 0; t < PyTuple_GET_SIZE(self->dicts); t++)
        if (permute_dict(PyTuple_GET_ITEM(self->dicts, t), dst, src, m.n) < 0)
            goto done;
    for (Py_ssize_t i = 0; moved != Py_None && i + 1 < m.cycles_len; i++) {
        if (m.cycles[i] < 0 || m.cycles[i + 1] < 0)
            continue;
        PyObject *rec = Py_BuildValue("(nnO)", m.cycles[i], m.cycles[i + 1], tag);
        int failed = rec == NULL || PyList_Append(moved, rec) < 0;
        Py_XDECREF(rec);
        if (failed)
            goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(tmp);
    free_moves(&m);
    return result;
}

static PyMethodDef batch_rows_methods[] = {
    {"permute", (PyCFunction)(void (*)(void))batch_rows_permute, METH_VARARGS | METH_KEYWORDS,
     batch_rows_permute_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BatchRowsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "vllm_seqhooks.native._rows.BatchRows",
    .tp_basicsize = sizeof(BatchRows),
    .tp_dealloc = (destructor)batch_rows_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = batch_rows_doc,
    .tp_methods = batch_rows_methods,
    .tp_new = batch_rows_new,
};

/* ------------------------------------------------------------ decision */

PyDoc_STRVAR(grouping_moves_doc,
"grouping_moves(codes) -> (dst, src) or None\n\n"
"vllm_seqhooks.core.batch_order.grouping_moves_in_python: each family (equal\n"
"codes, 0 <= code < 2**24) gets a block where its first longest run is,\n"
"blocks in the order of those runs; the members outside their family's\n"
"block move, in order, to the block's other slots. None when every family\n"
"is one run.");

/* The moves that group the n codes (a new reference: a (dst, src) tuple,
 * or None). */
static PyObject *moves_of(const Py_ssize_t *given, Py_ssize_t n) {
    if (n < 3)
        Py_RETURN_NONE;
    Py_ssize_t *codes = PyMem_Malloc(sizeof(Py_ssize_t) * n);
    if (codes == NULL)
        return PyErr_NoMemory();
    memcpy(codes, given, sizeof(Py_ssize_t) * n);
    /* per-family arrays span the codes present (the live families are
     * recent, so their codes are close together): code - lowest */
    Py_ssize_t lowest = codes[0], highest = codes[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        if (codes[i] < lowest)
            lowest = codes[i];
        if (codes[i] > highest)
            highest = codes[i];
    }
    for (Py_ssize_t i = 0; i < n; i++)
        codes[i] -= lowest;
    Py_ssize_t families = highest - lowest + 1;
    PyObject *result = NULL, *dst = NULL, *src = NULL;
    /* per family: members, longest run, its start; per position: owner */
    Py_ssize_t *size = PyMem_Calloc(families, sizeof(Py_ssize_t));
    Py_ssize_t *run = PyMem_Calloc(families, sizeof(Py_ssize_t));
    Py_ssize_t *start = PyMem_Calloc(families, sizeof(Py_ssize_t));
    Py_ssize_t *owner = PyMem_Malloc(sizeof(Py_ssize_t) * n);
    Py_ssize_t *next_dst = PyMem_Calloc(families + 1, sizeof(Py_ssize_t));
    Py_ssize_t *next_src = PyMem_Calloc(families + 1, sizeof(Py_ssize_t));
    if (!size || !run || !start || !owner || !next_dst || !next_src) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t present = 0, runs = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        present += size[codes[i]]++ == 0;
    for (Py_ssize_t s = 0, e; s < n; s = e) {
        for (e = s + 1; e < n && codes[e] == codes[s]; e++)
            ;
        runs++;
        if (e - s > run[codes[s]]) {
            run[codes[s]] = e - s;
            start[codes[s]] = s;
        }
    }
    if (runs == present) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t s = 0, e; s < n; s = e) {
        Py_ssize_t c = codes[s];
        for (e = s + 1; e < n && codes[e] == c; e++)
            ;
        if (start[c] == s)
            for (Py_ssize_t k = 0; k < size[c]; k++)
                owner[at++] = c;
    }
    /* misplaced positions sorted (stably) by family: by the family whose
     * block they are in (dst) and by the family they hold (src) */
    Py_ssize_t misplaced = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (codes[i] != owner[i]) {
            next_dst[owner[i] + 1]++;
            next_src[codes[i] + 1]++;
            misplaced++;
        }
    }
    for (Py_ssize_t c = 0; c < families; c++) {
        next_dst[c + 1] += next_dst[c];
        next_src[c + 1] += next_src[c];
    }
    dst = PyList_New(misplaced);
    src = PyList_New(misplaced);
    if (dst == NULL || src == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (codes[i] == owner[i])
            continue;
        PyObject *a = PyLong_FromSsize_t(i), *b = a ? Py_NewRef(a) : NULL;
        if (a == NULL)
            goto done;
        PyList_SET_ITEM(dst, next_dst[owner[i]]++, a);
        PyList_SET_ITEM(src, next_src[codes[i]]++, b);
    }
    result = PyTuple_Pack(2, dst, src);
done:
    Py_XDECREF(dst);
    Py_XDECREF(src);
    PyMem_Free(size);
    PyMem_Free(run);
    PyMem_Free(start);
    PyMem_Free(owner);
    PyMem_Free(next_dst);
    PyMem_Free(next_src);
    PyMem_Free(codes);
    return result;
}

static PyObject *grouping_moves(PyObject *self, PyObject *args) {
    PyObject *codes_list;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &codes_list))
        return NULL;
    Py_ssize_t *codes = read_rows(codes_list, MAX_CODE, "family code");
    if (codes == NULL)
        return NULL;
    PyObject *moves = moves_of(codes, PyList_GET_SIZE(codes_list));
    PyMem_Free(codes);
    return moves;
}

PyDoc_STRVAR(grouping_doc,
"Grouping(marker)\n\n"
"vllm_seqhooks.core.batch_order.group_in_python, step after step, keeping\n"
"the last batch (after its moves) and its family codes (as C integers).\n"
"moves(ids, known, families) -> (dst, src) or None: the codes read only\n"
"where `ids` does not hold the very object the last batch held (and past\n"
"its end), from `known` (request id -> code) or, for a request not in it,\n"
"from `families` (family id -> code; a new family gets the next code), its\n"
"family being its id up to `marker`; unless every such position holds a\n"
"member of the family it held, the moves that group them. `seen` and\n"
"`codes()` are the batch and codes kept; reset() forgets them.");

typedef struct {
    PyObject_HEAD
    PyObject *marker;
    PyObject *seen;
    Py_ssize_t *codes;
} Grouping;

static void grouping_dealloc(Grouping *self) {
    Py_XDECREF(self->marker);
    Py_XDECREF(self->seen);
    PyMem_Free(self->codes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *grouping_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"marker", NULL};
    PyObject *marker;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "U", names, &marker))
        return NULL;
    Grouping *self = (Grouping *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->marker = Py_NewRef(marker);
    self->seen = PyList_New(0);
    if (self->seen == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* The code of request `rid`, from `known` or made; -1 with an exception. */
static Py_ssize_t code_of(PyObject *rid, PyObject *known, PyObject *families, PyObject *marker) {
    PyObject *code = PyDict_GetItemWithError(known, rid);
    if (code == NULL) {
        if (PyErr_Occurred())
            return -1;
        if (!PyUnicode_Check(rid)) {
            PyErr_SetString(PyExc_TypeError, "request ids are strings");
            return -1;
        }
        Py_ssize_t at = PyUnicode_Find(rid, marker, 0, PyUnicode_GET_LENGTH(rid), 1);
        if (at == -2)
            return -1;
        PyObject *family = at < 0 ? Py_NewRef(rid) : PyUnicode_Substring(rid, 0, at);
        PyObject *next = family ? PyLong_FromSsize_t(PyDict_GET_SIZE(families)) : NULL;
        code = next ? PyDict_SetDefault(families, family, next) : NULL;
        if (code != NULL && PyDict_SetItem(known, rid, code) < 0)
            code = NULL;
        Py_XDECREF(family);
        Py_XDECREF(next);
        if (code == NULL)
            return -1;
    }
    Py_ssize_t value = PyLong_AsSsize_t(code);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value < 0 || value >= MAX_CODE) {
        PyErr_Format(PyExc_ValueError, "family code %zd outside [0, 2**24)", value);
        return -1;
    }
    return value;
}

static PyObject *grouping_moves_step(Grouping *self, PyObject *args) {
    PyObject *ids, *known, *families;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &ids, &PyDict_Type, &known,
                          &PyDict_Type, &families))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(ids), m = PyList_GET_SIZE(self->seen);
    /* the codes of this batch: the last batch's, -1 past its end, then
     * read where the request changed (on a copy: nothing changes on error) */
    Py_ssize_t *codes = PyMem_Malloc(sizeof(Py_ssize_t) * (n ? n : 1));
    if (codes == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++)
        codes[i] = i < m ? self->codes[i] : -1;
    int kept = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *rid = PyList_GET_ITEM(ids, i);
        if (i < m && rid == PyList_GET_ITEM(self->seen, i))
            continue;
        Py_ssize_t code = code_of(rid, known, families, self->marker);
        if (code < 0) {
            PyMem_Free(codes);
            return NULL;
        }
        if (code != codes[i]) {
            codes[i] = code;
            kept = 0;
        }
    }
    PyObject *moves = kept ? Py_NewRef(Py_None) : moves_of(codes, n);
    PyObject *snapshot = moves ? PyList_GetSlice(ids, 0, n) : NULL;
    if (snapshot == NULL) {
        Py_XDECREF(moves);
        PyMem_Free(codes);
        return NULL;
    }
    if (moves != Py_None) {
        Moves mv;
        if (read_moves(PyTuple_GET_ITEM(moves, 0), PyTuple_GET_ITEM(moves, 1), &mv) < 0) {
            Py_DECREF(moves);
            Py_DECREF(snapshot);
            PyMem_Free(codes);
            return NULL;
        }
        permute_items(snapshot, &mv);
        for (Py_ssize_t i = 0; i < mv.cycles_len; i++) {
            Py_ssize_t row = mv.cycles[i], first = codes[row];
            for (; mv.cycles[i + 1] >= 0; i++, row = mv.cycles[i])
                codes[row] = codes[mv.cycles[i + 1]];
            codes[row] = first;
            i++;
        }
        free_moves(&mv);
    }
    Py_SETREF(self->seen, snapshot);
    PyMem_Free(self->codes);
    self->codes = codes;
    return moves;
}

static PyObject *grouping_codes(Grouping *self, PyObject *unused) {
    Py_ssize_t n = PyList_GET_SIZE(self->seen);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *code = PyLong_FromSsize_t(self->codes[i]);
        if (code == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, code);
    }
    return out;
}

static PyObject *grouping_reset(Grouping *self, PyObject *unused) {
    PyObject *empty = PyList_New(0);
    if (empty == NULL)
        return NULL;
    Py_SETREF(self->seen, empty);
    return Py_NewRef(Py_None);
}

static PyObject *grouping_seen(Grouping *self, void *unused) { return Py_NewRef(self->seen); }

static PyMethodDef grouping_methods[] = {
    {"moves", (PyCFunction)grouping_moves_step, METH_VARARGS, NULL},
    {"codes", (PyCFunction)grouping_codes, METH_NOARGS, NULL},
    {"reset", (PyCFunction)grouping_reset, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef grouping_getset[] = {
    {"seen", (getter)grouping_seen, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject GroupingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "vllm_seqhooks.native._rows.Grouping",
    .tp_basicsize = sizeof(Grouping),
    .tp_dealloc = (destructor)grouping_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = grouping_doc,
    .tp_methods = grouping_methods,
    .tp_getset = grouping_getset,
    .tp_new = grouping_new,
};

/* ------------------------------------------------------------ module */

static PyMethodDef methods[] = {
    {"grouping_moves", grouping_moves, METH_VARARGS, grouping_moves_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows",
    "Compiled kernels of the family batch order (see vllm_seqhooks.native).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rows(void) {
    if (PyType_Ready(&BatchRowsType) < 0 || PyType_Ready(&GroupingType) < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod != NULL &&
        (PyModule_AddObjectRef(mod, "BatchRows", (PyObject *)&BatchRowsType) < 0 ||
         PyModule_AddObjectRef(mod, "Grouping", (PyObject *)&GroupingType) < 0))
        Py_CLEAR(mod);
    return mod;
}
