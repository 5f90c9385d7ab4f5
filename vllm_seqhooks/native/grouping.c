/* Grouping: the family batch order's decision, step after step (the
 * twin of vllm_seqhooks.core.batch_order.group_in_python), and
 * grouping_moves (of grouping_moves_in_python). */

#include "moves.h"

PyDoc_STRVAR(grouping_moves_doc,
"grouping_moves(codes) -> (dst, src) or None\n\n"
"vllm_seqhooks.core.batch_order.grouping_moves_in_python: each family (equal\n"
"codes, 0 <= code < 2**24) gets a block where its first longest run is,\n"
"blocks in the order of those runs; the members outside their family's\n"
"block move, in order, to the block's other slots. None when every family\n"
"is one run.");

/* Each position's owner (the family whose block it is in): each family's
 * block where its first longest run is, blocks in the order of those runs.
 * codes: 0 <= code < families. 1 when every family is one run already (no
 * owners then), 0, or -1 with an exception. */
static int owners(const Py_ssize_t *codes, Py_ssize_t n, Py_ssize_t families,
                  Py_ssize_t *owner) {
    Py_ssize_t *size = PyMem_Calloc(families, sizeof(Py_ssize_t));
    Py_ssize_t *run = PyMem_Calloc(families, sizeof(Py_ssize_t));
    Py_ssize_t *start = PyMem_Calloc(families, sizeof(Py_ssize_t));
    int rc = -1;
    if (!size || !run || !start) {
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
    rc = runs == present;
    Py_ssize_t at = 0;
    for (Py_ssize_t s = 0, e; s < n && !rc; s = e) {
        Py_ssize_t c = codes[s];
        for (e = s + 1; e < n && codes[e] == c; e++)
            ;
        if (start[c] == s)
            for (Py_ssize_t k = 0; k < size[c]; k++)
                owner[at++] = c;
    }
done:
    PyMem_Free(size);
    PyMem_Free(run);
    PyMem_Free(start);
    return rc;
}

/* The positions not in their family's block, sorted (stably) by family: by
 * the family whose block they are in (dst) and by the family they hold
 * (src); a (dst, src) tuple. */
static PyObject *misplaced(const Py_ssize_t *codes, const Py_ssize_t *owner, Py_ssize_t n,
                           Py_ssize_t families) {
    Py_ssize_t *next_dst = PyMem_Calloc(families + 1, sizeof(Py_ssize_t));
    Py_ssize_t *next_src = PyMem_Calloc(families + 1, sizeof(Py_ssize_t));
    PyObject *result = NULL, *dst = NULL, *src = NULL;
    if (!next_dst || !next_src) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t count = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (codes[i] != owner[i]) {
            next_dst[owner[i] + 1]++;
            next_src[codes[i] + 1]++;
            count++;
        }
    }
    for (Py_ssize_t c = 0; c < families; c++) {
        next_dst[c + 1] += next_dst[c];
        next_src[c + 1] += next_src[c];
    }
    dst = PyList_New(count);
    src = PyList_New(count);
    if (dst == NULL || src == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (codes[i] == owner[i])
            continue;
        PyObject *row = PyLong_FromSsize_t(i);
        if (row == NULL)
            goto done;
        PyList_SET_ITEM(dst, next_dst[owner[i]]++, Py_NewRef(row));
        PyList_SET_ITEM(src, next_src[codes[i]]++, row);
    }
    result = PyTuple_Pack(2, dst, src);
done:
    Py_XDECREF(dst);
    Py_XDECREF(src);
    PyMem_Free(next_dst);
    PyMem_Free(next_src);
    return result;
}

/* The moves that group the n codes (a new reference: a (dst, src) tuple,
 * or None). */
static PyObject *moves_of(const Py_ssize_t *given, Py_ssize_t n) {
    if (n < 3)
        Py_RETURN_NONE;
    /* per-family arrays span the codes present (the live families are
     * recent, so their codes are close together): code - lowest */
    Py_ssize_t lowest = given[0], highest = given[0];
    for (Py_ssize_t i = 1; i < n; i++) {
        if (given[i] < lowest)
            lowest = given[i];
        if (given[i] > highest)
            highest = given[i];
    }
    Py_ssize_t *codes = PyMem_Malloc(sizeof(Py_ssize_t) * n);
    Py_ssize_t *owner = PyMem_Malloc(sizeof(Py_ssize_t) * n);
    PyObject *result = NULL;
    if (codes == NULL || owner == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        codes[i] = given[i] - lowest;
    Py_ssize_t families = highest - lowest + 1;
    int grouped = owners(codes, n, families, owner);
    if (grouped >= 0)
        result = grouped ? Py_NewRef(Py_None) : misplaced(codes, owner, n, families);
done:
    PyMem_Free(codes);
    PyMem_Free(owner);
    return result;
}

static PyObject *grouping_moves(PyObject *self, PyObject *args) {
    PyObject *codes_list;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &codes_list))
        return NULL;
    Py_ssize_t *codes = seqhooks_read_rows(codes_list, MAX_CODE, "family code");
    if (codes == NULL)
        return NULL;
    PyObject *moves = moves_of(codes, PyList_GET_SIZE(codes_list));
    PyMem_Free(codes);
    return moves;
}

PyDoc_STRVAR(grouping_doc,
"Grouping(marker, known, families, forget_after)\n\n"
"vllm_seqhooks.core.batch_order.FamilyGrouping's step (group_in_python),\n"
"step after step, keeping the last batch (after its moves) and its family\n"
"codes (as C integers). moves(ids) -> (dst, src) or None: the codes read\n"
"only where `ids` does not hold the very object the last batch held (and\n"
"past its end), from `known` (request id -> code) or, for a request not in\n"
"it, from `families` (family id -> code; a new family gets the next code),\n"
"its family being its id up to `marker`; unless every such position holds\n"
"a member of the family it held, the moves that group them. When `known`\n"
"holds more than `forget_after` requests, both dicts and the batch kept are\n"
"forgotten first. `seen` and `codes()` are the batch and codes kept.");

typedef struct {
    PyObject_HEAD
    PyObject *marker;
    PyObject *known;
    PyObject *families;
    Py_ssize_t forget_after;
    PyObject *seen;
    Py_ssize_t *codes;
} Grouping;

static void grouping_dealloc(Grouping *self) {
    Py_XDECREF(self->marker);
    Py_XDECREF(self->known);
    Py_XDECREF(self->families);
    Py_XDECREF(self->seen);
    PyMem_Free(self->codes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *grouping_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"marker", "known", "families", "forget_after", NULL};
    PyObject *marker, *known, *families;
    Py_ssize_t forget_after;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UO!O!n", names, &marker, &PyDict_Type,
                                     &known, &PyDict_Type, &families, &forget_after))
        return NULL;
    Grouping *self = (Grouping *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->marker = Py_NewRef(marker);
    self->known = Py_NewRef(known);
    self->families = Py_NewRef(families);
    self->forget_after = forget_after;
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

static PyObject *grouping_moves_step(Grouping *self, PyObject *ids) {
    if (!PyList_Check(ids)) {
        PyErr_SetString(PyExc_TypeError, "the batch's request ids are a list");
        return NULL;
    }
    if (PyDict_GET_SIZE(self->known) > self->forget_after) { /* finished ones accumulate */
        PyDict_Clear(self->known);
        PyDict_Clear(self->families);
        PyObject *empty = PyList_New(0);
        if (empty == NULL)
            return NULL;
        Py_SETREF(self->seen, empty);
    }
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
        Py_ssize_t code = code_of(rid, self->known, self->families, self->marker);
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
        if (seqhooks_read_moves(PyTuple_GET_ITEM(moves, 0), PyTuple_GET_ITEM(moves, 1), &mv) < 0) {
            Py_DECREF(moves);
            Py_DECREF(snapshot);
            PyMem_Free(codes);
            return NULL;
        }
        seqhooks_permute_items(snapshot, &mv);
        seqhooks_permute_ints(codes, &mv);
        seqhooks_free_moves(&mv);
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

static PyObject *grouping_seen(Grouping *self, void *unused) { return Py_NewRef(self->seen); }

static PyMethodDef grouping_methods[] = {
    {"moves", (PyCFunction)grouping_moves_step, METH_O, NULL},
    {"codes", (PyCFunction)grouping_codes, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef grouping_getset[] = {
    {"seen", (getter)grouping_seen, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SeqhooksGroupingType = {
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

PyMethodDef seqhooks_grouping_functions[] = {
    {"grouping_moves", grouping_moves, METH_VARARGS, grouping_moves_doc},
    {NULL, NULL, 0, NULL},
};

