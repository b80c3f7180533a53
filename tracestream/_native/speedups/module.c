/* The module tracestream._native._speedups (speedups.h says what each file holds): its
   method table, each function defined in the file of its concern, and its init, which
   readies the Scan type (scan.c) and adds json_rows' column kinds (rows.c) as constants. */

#include "speedups.h"

static PyMethodDef methods[] = {
    {"separators", separators, METH_O, separators_doc},
    {"splice", splice, METH_VARARGS, splice_doc},
    {"integer_ends", integer_ends, METH_VARARGS, integer_ends_doc},
    {"event_keys", event_keys, METH_VARARGS, event_keys_doc},
    {"continues", continues, METH_VARARGS, continues_doc},
    {"slice_keys", slice_keys, METH_VARARGS, slice_keys_doc},
    {"classify", classify, METH_VARARGS, classify_doc},
    {"first_set", first_set, METH_VARARGS, first_set_doc},
    {"name_counts", name_counts, METH_VARARGS, name_counts_doc},
    {"first_unhashable_device", first_unhashable_device, METH_VARARGS,
     first_unhashable_device_doc},
    {"named", named, METH_VARARGS, named_doc},
    {"match_keys", match_keys, METH_VARARGS, match_keys_doc},
    {"flow_columns", flow_columns, METH_VARARGS, flow_columns_doc},
    {"track_keys", track_keys, METH_VARARGS, track_keys_doc},
    {"decimal_column", decimal_column, METH_VARARGS, decimal_column_doc},
    {"check_columns", check_columns, METH_VARARGS, check_columns_doc},
    {"scan_events", scan_events, METH_VARARGS, scan_events_doc},
    {"event_values", event_values, METH_VARARGS, event_values_doc},
    {"json_rows", json_rows, METH_VARARGS, json_rows_doc},
    {"undo_relocations", undo_relocations, METH_O, undo_relocations_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "tracestream._native._speedups",
    "The per-chunk work of both passes, in C (see tracestream/_native/__init__.py).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&ScannedType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    static const char *kinds[COLUMN_KINDS] = {"TEXTS", "INTEGERS", "FIXED", "SHORTEST", "CODED"};
    for (int k = 0; k < COLUMN_KINDS; k++)
        if (PyModule_AddIntConstant(m, kinds[k], k) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    return m;
}
