/* tracestream._native._speedups, the per-chunk work of both passes that numpy and
   per-event Python did, in C: byte scans of a chunk, reading the decoded events' fields,
   and the rewrite's splice.

   Each function returns exactly what the code it stands in for in the index, write
   and commands packages returns (the tests compare the two). That code stays the
   reference, and the package works without this module: setup.py builds it as an
   optional extension, and tracestream/_native/__init__.py says which one runs.

   Positions come back as bytearrays of native int64, for np.frombuffer.

   The module is built from the files of this folder (setup.py lists them), one concern
   each:
     speedups.h  what they share: the types, the inline helpers, the functions one file
                 defines for others, and the module's functions for module.c's table
     module.c    the method table, the module and its init
     keyscan.c   byte scans of a chunk: separators, event_keys, continues, integer_ends
     scan.c      scan_events and its Scan type: a chunk's events read in one pass
     events.c    the events a function reads (structs or a scan) and their fields
     columns.c   fields as columns: event_values, decimal_column, check_columns
     keys.c      keys coded in order of first appearance: slice_keys, match_keys,
                 track_keys, flow_columns
     classify.c  classify, first_set, and kernels by name: name_counts,
                 first_unhashable_device, named
     splice.c    the rewrite's splice and restore's quick undo (undo_relocations)
     rows.c      the anchors report's JSON rows (json_rows)
   Everything else stays static in its file. */

#ifndef TRACESTREAM_SPEEDUPS_H
#define TRACESTREAM_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Everything declared here is the extension's own, with hidden visibility: a function or
   object one file defines for others is not exported by the module (PyInit__speedups
   alone is, as when all of them were static in one file), and no library's symbol of the
   same name (libc's splice) can take its place. */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* The key of a relocated event's provenance member (events.PROVENANCE_KEY). */
static const char PROVENANCE_KEY[] = "_compact_gpu_track";
#define PROVENANCE_KEY_LEN ((Py_ssize_t)sizeof PROVENANCE_KEY - 1)

static inline int
is_json_space(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static inline const unsigned char *
skip_space(const unsigned char *p, const unsigned char *end)
{
    while (p < end && is_json_space(*p))
        p++;
    return p;
}

/* An int64 column given as a buffer, of `count` items (any number when count < 0), aligned
   (a misaligned one is copied); 0, or -1 with an exception. Defined in keyscan.c; splice.c
   and rows.c read their columns with it. */
int column(PyObject *obj, Py_buffer *view, Py_ssize_t count, const char *name);

/* -- an event's fields (events.c) ------------------------------------------------------- */

/* A field of objects that are mostly of one type: read from its slot in objects of
   the first type seen, with getattr in any other. */
typedef struct {
    const char *name;
    PyTypeObject *type;
    Py_ssize_t offset;
    int column; /* in a scan: 0 not looked up yet, -1 none, else F_* + 1 (field_column) */
} Field;

/* The field's value (a new reference), or NULL with an exception. Defined in events.c;
   columns.c reads verify's provenance structs with it too. */
PyObject *read_field(PyObject *object, Field *field);

/* -- the scan (scan.c): the fields it keeps, where each value lies and its kind ---------- */

enum { F_PH, F_CAT, F_NAME, F_PID, F_TID, F_TS, F_DUR, F_ARGS, F_ID, F_BP,
       F_DEVICE, F_STREAM, F_PROVENANCE, F_ORIGIN_PID, F_ORIGIN_TID, SCAN_FIELDS };
static const char *const scan_field_names[SCAN_FIELDS] = {
    "ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "bp",
    "device", "stream", "provenance", "origin pid", "origin tid"};
enum { V_ABSENT, V_STRING, V_ESCAPED, V_INT, V_NUMBER, V_NULL, V_TRUE, V_FALSE,
       V_OBJECT, V_ARRAY };

typedef struct {
    int32_t off;       /* the value's text, in the scanned document */
    uint32_t len : 28;
    uint32_t type : 4; /* V_* */
} Span;

/* Whether a span is an integer of at most 18 digits (within int64 whatever they are). */
static inline int
short_int(const unsigned char *d, const Span *span)
{
    return span->type == V_INT && span->len - (d[span->off] == '-') <= 18;
}

/* The value of a short integer's text (short_int). */
static inline int64_t
short_int_value(const unsigned char *text, Py_ssize_t len)
{
    int64_t number = 0;
    for (Py_ssize_t j = text[0] == '-'; j < len; j++)
        number = 10 * number + (text[j] - '0');
    return text[0] == '-' ? -number : number;
}

/* One distinct string text of the scan: where its str is in the scan's `values`. */
typedef struct {
    uint64_t hash;
    int32_t off, len;
    int32_t value; /* -1: an empty entry */
} Interned;

#define INT_CACHE 64 /* recent int values kept, by value (scanned_value) */

typedef struct {
    PyObject_HEAD
    Py_buffer view;         /* the scanned document, held while the scan lives */
    const unsigned char *d;
    Py_ssize_t n;           /* events */
    int64_t *starts, *ends; /* each event's bytes, in the document */
    Span *col[SCAN_FIELDS]; /* per field, each event's value */
    PyObject *decode_value; /* msgspec.json.decode: a value's text -> its object */
    PyObject *decode_event; /* one event's text -> the struct msgspec makes of it */
    PyObject *unset;        /* msgspec.UNSET: an absent provenance */
    PyObject *empty;        /* b"": an absent ts or dur */
    Interned *table;        /* distinct string texts, open addressing */
    Py_ssize_t table_size, table_used;
    PyObject **values;      /* their str, in order of first use (strong references) */
    int32_t *memo[SCAN_FIELDS]; /* per field and event: its str's number, -1 not looked up */
    int64_t int_key[INT_CACHE];
    PyObject *int_value[INT_CACHE];
    int shift;              /* 1 where the document is bracketed: the chunk is d + 1 */
    int fields;             /* columns kept: SCAN_FIELDS with `origins`, else those before
                               the provenance's own (F_ORIGIN_PID) */
    char origins;           /* the provenance read as verify's struct (scan_events) */
    char ascii;             /* no byte above 0x7F: no UTF-8 to check */
} Scanned;

/* The Scan type (scan.c): events_arg tells a scan by it, module.c's init readies it. */
extern PyTypeObject ScannedType;

/* The value of field `field` of event i as msgspec gives it (a new reference), or NULL
   with an exception. Not for F_ARGS itself. Defined in scan.c; events.c and columns.c read
   a scan's fields with it. */
PyObject *scanned_value(Scanned *s, Py_ssize_t i, int field);

/* -- the events a function reads (events.c) --------------------------------------------

   The functions of columns.c, keys.c and classify.c take a list of msgspec structs or a
   scan (Events) and read their fields with the functions below, defined in events.c;
   the two small ones they call per event are inline here. */

/* The events a function reads: a list of msgspec structs, or a scan. */
typedef struct {
    PyObject *list;
    Scanned *scan;
    Py_ssize_t size;
} Events;

/* PyArg_ParseTuple's "O&" converter for Events. */
int events_arg(PyObject *object, void *address);

/* The scan's column of a field (F_*), found by its name once, or -1. */
int field_column(Field *field);

/* events[i].<field> (a new reference), or NULL with an exception. */
PyObject *event_field(Events *events, Py_ssize_t i, Field *field);

/* events[i].args.<inner>, or `no_args` where args is None (a new reference), or NULL with
   an exception. */
PyObject *event_args_field(Events *events, Py_ssize_t i, Field *args_field, Field *inner,
                           PyObject *no_args);

/* For a scan: whether field `column` of event i is the one-letter string `letter` (1 or
   0), or -1 where the value must be decoded to know (escapes); -1 for a list too. */
static inline int
scanned_is_char(Events *events, Py_ssize_t i, int column, char letter)
{
    if (events->scan == NULL)
        return -1;
    const Span *span = &events->scan->col[column][i];
    if (span->type == V_ESCAPED)
        return -1;
    return span->type == V_STRING && span->len == 3
           && events->scan->d[span->off + 1] == (unsigned char)letter;
}

/* The event index held by `index` (an int), or -1 with an IndexError. */
static inline Py_ssize_t
event_index(Events *events, PyObject *index)
{
    Py_ssize_t at = PyLong_AsSsize_t(index);
    if (at < 0 || at >= events->size) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_IndexError, "an index past the events");
        return -1;
    }
    return at;
}

/* -- the module's functions ------------------------------------------------------------

   Each is defined, with its docstring <name>_doc, in the file of its concern, and listed
   in module.c's method table. */

/* PyDoc_STRVAR without its `static`: a module function's docstring, defined beside the
   function, for module.c's table. */
#define SHARED_DOC(name, str) const char name[] = PyDoc_STR(str)

/* keyscan.c */
extern const char separators_doc[], event_keys_doc[], integer_ends_doc[], continues_doc[];
PyObject *separators(PyObject *module, PyObject *arg);
PyObject *event_keys(PyObject *module, PyObject *args);
PyObject *integer_ends(PyObject *module, PyObject *args);
PyObject *continues(PyObject *module, PyObject *args);

/* scan.c */
extern const char scan_events_doc[];
PyObject *scan_events(PyObject *module, PyObject *args);

/* columns.c */
extern const char event_values_doc[], decimal_column_doc[], check_columns_doc[];
PyObject *event_values(PyObject *module, PyObject *args);
PyObject *decimal_column(PyObject *module, PyObject *args);
PyObject *check_columns(PyObject *module, PyObject *args);

/* keys.c */
extern const char slice_keys_doc[], match_keys_doc[], track_keys_doc[], flow_columns_doc[];
PyObject *slice_keys(PyObject *module, PyObject *args);
PyObject *match_keys(PyObject *module, PyObject *args);
PyObject *track_keys(PyObject *module, PyObject *args);
PyObject *flow_columns(PyObject *module, PyObject *args);

/* classify.c */
extern const char classify_doc[], first_set_doc[], name_counts_doc[],
    first_unhashable_device_doc[], named_doc[];
PyObject *classify(PyObject *module, PyObject *args);
PyObject *first_set(PyObject *module, PyObject *args);
PyObject *name_counts(PyObject *module, PyObject *args);
PyObject *first_unhashable_device(PyObject *module, PyObject *args);
PyObject *named(PyObject *module, PyObject *args);

/* splice.c */
extern const char splice_doc[], undo_relocations_doc[];
PyObject *splice(PyObject *module, PyObject *args);
PyObject *undo_relocations(PyObject *module, PyObject *arg);

/* rows.c: json_rows, and the kinds of its columns (module constants, see module.c) */
extern const char json_rows_doc[];
PyObject *json_rows(PyObject *module, PyObject *args);
enum { TEXTS, INTEGERS, FIXED, SHORTEST, CODED, COLUMN_KINDS };

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif /* TRACESTREAM_SPEEDUPS_H */
