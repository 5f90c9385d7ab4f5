/* Reading, checking and applying moves (moves.h). */

#include "moves.h"

#include <string.h>

Py_ssize_t *seqhooks_read_rows(PyObject *list, Py_ssize_t limit, const char *what) {
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

void seqhooks_free_moves(Moves *m) {
    PyMem_Free(m->dst);
    PyMem_Free(m->src);
    PyMem_Free(m->cycles);
    m->dst = m->src = m->cycles = NULL;
}

/* takes[r]: the row whose content row r takes, -1 for rows not moved (rows
 * below `rows`); NULL with an exception unless the dst rows are distinct
 * and the src rows distinct and among them. */
static Py_ssize_t *takes_of(const Moves *m, Py_ssize_t rows) {
    Py_ssize_t *takes = PyMem_Malloc(sizeof(Py_ssize_t) * (rows ? rows : 1));
    unsigned char *given = PyMem_Calloc(rows ? rows : 1, 1);
    if (takes == NULL || given == NULL) {
        PyMem_Free(takes);
        PyMem_Free(given);
        PyErr_NoMemory();
        return NULL;
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
        PyErr_SetString(PyExc_ValueError, "moves are not a permutation of one set of rows");
        return NULL;
    }
    return takes;
}

/* The cycles of `takes`, found from the dst rows in order (emptying it). */
static void list_cycles(Moves *m, Py_ssize_t *takes) {
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
}

int seqhooks_read_moves(PyObject *dst, PyObject *src, Moves *m) {
    m->dst = m->src = m->cycles = NULL;
    m->cycles_len = 0;
    m->n = PyList_GET_SIZE(dst);
    if (PyList_GET_SIZE(src) != m->n) {
        PyErr_SetString(PyExc_ValueError, "dst and src differ in length");
        return -1;
    }
    m->dst = seqhooks_read_rows(dst, MAX_ROWS, "dst row");
    m->src = m->dst ? seqhooks_read_rows(src, MAX_ROWS, "src row") : NULL;
    m->cycles = m->src ? PyMem_Malloc(sizeof(Py_ssize_t) * (2 * m->n + 1)) : NULL;
    if (m->cycles == NULL) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        seqhooks_free_moves(m);
        return -1;
    }
    Py_ssize_t rows = 0;
    for (Py_ssize_t k = 0; k < m->n; k++)
        if (m->dst[k] >= rows)
            rows = m->dst[k] + 1;
    Py_ssize_t *takes = takes_of(m, rows);
    if (takes == NULL) {
        seqhooks_free_moves(m);
        return -1;
    }
    list_cycles(m, takes);
    PyMem_Free(takes);
    return 0;
}

void seqhooks_permute_rows(const Rows *rows, const Moves *m, char *tmp) {
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

void seqhooks_permute_items(PyObject *list, const Moves *m) {
    /* The items only change places (the moves permute one set of rows). */
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

void seqhooks_permute_ints(Py_ssize_t *values, const Moves *m) {
    const Py_ssize_t *c = m->cycles;
    for (Py_ssize_t i = 0; i < m->cycles_len; i++) {
        Py_ssize_t row = c[i], first = values[row];
        for (; c[i + 1] >= 0; i++, row = c[i])
            values[row] = values[c[i + 1]];
        values[row] = first;
        i++;
    }
}
