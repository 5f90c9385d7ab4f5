/* vllm_seqhooks.native._rows: the compiled kernels of the family batch
 * order. grouping.c decides (Grouping, grouping_moves: the twins of
 * vllm_seqhooks.core.batch_order's Python step); batch_rows.c applies the
 * moves to a batch (BatchRows: what vllm_seqhooks.engine.vllm_private.
 * input_batch does with numpy and Python otherwise); moves.c reads, checks
 * and applies moves (moves.h). tests/test_native.py compares each with its
 * Python twin. Nothing here knows vLLM: callers hand over lists, dicts and
 * buffers. */

#include "moves.h"

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows",
    "Compiled kernels of the family batch order (see vllm_seqhooks.native).", -1,
    seqhooks_grouping_functions, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rows(void) {
    if (PyType_Ready(&SeqhooksBatchRowsType) < 0 || PyType_Ready(&SeqhooksGroupingType) < 0)
        return NULL;
    PyObject *mod = PyModule_Create(&module);
    if (mod != NULL &&
        (PyModule_AddObjectRef(mod, "BatchRows", (PyObject *)&SeqhooksBatchRowsType) < 0 ||
         PyModule_AddObjectRef(mod, "Grouping", (PyObject *)&SeqhooksGroupingType) < 0))
        Py_CLEAR(mod);
    return mod;
}
