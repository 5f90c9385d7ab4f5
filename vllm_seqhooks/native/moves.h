/* Moves of a batch's rows, shared by the compiled kernels of
 * vllm_seqhooks.native (see _rows.c).
 *
 * A move is a pair of equal-length lists of row indices (dst, src): row
 * dst[k] takes what row src[k] held. read_moves checks that they permute
 * one set of rows and lists the permutation's cycles, along which
 * permute_rows and permute_items move buffers' rows and lists' items. */

#ifndef SEQHOOKS_MOVES_H
#define SEQHOOKS_MOVES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Families (codes) the grouping decision accepts: 0 <= code < MAX_CODE;
 * rows the moves may name: 0 <= row < MAX_ROWS. */
#define MAX_CODE (1 << 24)
#define MAX_ROWS (1 << 24)

/* Moves read and checked. `cycles` lists the permutation's cycles, each as
 * s, a, b, ..., z, -1: row s takes row a's content, a takes b's, ..., z
 * takes s's. A row that takes its own content is in no cycle. */
typedef struct {
    Py_ssize_t n;
    Py_ssize_t *dst;
    Py_ssize_t *src;
    Py_ssize_t *cycles;
    Py_ssize_t cycles_len;
} Moves;

/* A buffer whose rows move: its first `nbytes` bytes of each row. */
typedef struct {
    Py_buffer view;
    Py_ssize_t nbytes;
} Rows;

/* The ints of a list, as C integers in [0, limit); NULL with an exception. */
Py_ssize_t *seqhooks_read_rows(PyObject *list, Py_ssize_t limit, const char *what);
/* 0, or -1 with an exception (then `m` holds nothing to free). */
int seqhooks_read_moves(PyObject *dst, PyObject *src, Moves *m);
void seqhooks_free_moves(Moves *m);
/* Move the rows along each cycle, through one row's worth of `tmp`. */
void seqhooks_permute_rows(const Rows *rows, const Moves *m, char *tmp);
/* Move a list's items along each cycle (no reference count changes). */
void seqhooks_permute_items(PyObject *list, const Moves *m);
/* Move C integers along each cycle. */
void seqhooks_permute_ints(Py_ssize_t *values, const Moves *m);

extern PyTypeObject SeqhooksBatchRowsType;
extern PyTypeObject SeqhooksGroupingType;
extern PyMethodDef seqhooks_grouping_functions[];

#endif
