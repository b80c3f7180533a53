/* Events' keys coded in order of first appearance (pair_code, and a cache of it for
   pairs of ints): slice_keys, match_keys, track_keys and flow_columns. */

#include "speedups.h"

/* The code of (a, b) among `keys` (appended, with the next code, when new); -1 on error
   (a TypeError for an unhashable member). */
static long
pair_code(PyObject *codes, PyObject *keys, PyObject *a, PyObject *b)
{
    PyObject *key = PyTuple_Pack(2, a, b);
    if (key == NULL)
        return -1;
    long code = -1;
    PyObject *found = PyDict_GetItemWithError(codes, key);
    if (found != NULL) {
        code = PyLong_AsLong(found);
    }
    else if (!PyErr_Occurred()) {
        PyObject *next = PyLong_FromSsize_t(PyList_GET_SIZE(keys));
        if (next != NULL && PyDict_SetItem(codes, key, next) == 0
            && PyList_Append(keys, key) == 0)
            code = PyList_GET_SIZE(keys) - 1;
        Py_XDECREF(next);
    }
    Py_DECREF(key);
    return code;
}

/* A cache of pair_code's answers for pairs of exact ints, by value: most GPU events'
   pid, tid and device are small ints, and a tuple and a dict lookup per event cost
   more than the rest of slice_keys. Only a cache: every code still comes from the dict
   the first time, so the codes and the order of the keys are pair_code's. */
typedef struct {
    int64_t *a, *b;
    int32_t *code; /* -1: empty */
    Py_ssize_t cap, used;
} IntPairs;

static void
int_pairs_free(IntPairs *pairs)
{
    PyMem_Free(pairs->a);
    PyMem_Free(pairs->b);
    PyMem_Free(pairs->code);
    memset(pairs, 0, sizeof *pairs);
}

static Py_ssize_t
int_pair_slot(const IntPairs *pairs, int64_t a, int64_t b)
{
    uint64_t h = ((uint64_t)a * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)b * 0xC2B2AE3D27D4EB4Full);
    Py_ssize_t mask = pairs->cap - 1;
    for (Py_ssize_t at = (Py_ssize_t)((h ^ (h >> 29)) & (uint64_t)mask);; at = (at + 1) & mask) {
        if (pairs->code[at] < 0 || (pairs->a[at] == a && pairs->b[at] == b))
            return at;
    }
}

/* Room for one more pair (the table stays at most half full); 0 on failure. */
static int
int_pairs_reserve(IntPairs *pairs)
{
    if (2 * (pairs->used + 1) <= pairs->cap)
        return 1;
    IntPairs bigger = {NULL, NULL, NULL, pairs->cap ? 2 * pairs->cap : 256, pairs->used};
    bigger.a = PyMem_Malloc(bigger.cap * sizeof(int64_t));
    bigger.b = PyMem_Malloc(bigger.cap * sizeof(int64_t));
    bigger.code = PyMem_Malloc(bigger.cap * sizeof(int32_t));
    if (bigger.a == NULL || bigger.b == NULL || bigger.code == NULL) {
        int_pairs_free(&bigger);
        PyErr_NoMemory();
        return 0;
    }
    memset(bigger.code, 0xff, bigger.cap * sizeof(int32_t));
    for (Py_ssize_t i = 0; i < pairs->cap; i++) {
        if (pairs->code[i] >= 0) {
            Py_ssize_t at = int_pair_slot(&bigger, pairs->a[i], pairs->b[i]);
            bigger.a[at] = pairs->a[i];
            bigger.b[at] = pairs->b[i];
            bigger.code[at] = pairs->code[i];
        }
    }
    int_pairs_free(pairs);
    *pairs = bigger;
    return 1;
}

/* The value of an exact int that fits in 64 bits, in *value; 0 for anything else. */
static int
exact_int(PyObject *object, int64_t *value)
{
    if (!PyLong_CheckExact(object))
        return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(object, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *value = v;
    return 1;
}

/* pair_code, answered from `pairs` where a and b are exact ints. */
static long
cached_pair_code(IntPairs *pairs, PyObject *codes, PyObject *keys, PyObject *a, PyObject *b)
{
    int64_t x, y;
    if (!exact_int(a, &x) || !exact_int(b, &y))
        return pair_code(codes, keys, a, b);
    if (!int_pairs_reserve(pairs))
        return -1;
    Py_ssize_t at = int_pair_slot(pairs, x, y);
    if (pairs->code[at] >= 0)
        return pairs->code[at];
    long code = pair_code(codes, keys, a, b);
    if (code >= 0) {
        pairs->a[at] = x;
        pairs->b[at] = y;
        pairs->code[at] = (int32_t)code;
        pairs->used++;
    }
    return code;
}

SHARED_DOC(slice_keys_doc,
"slice_keys(events, indices, scopes, scopes_device)\n"
"-> (track codes, track keys, group codes, group keys)\n\n"
"For the events at `indices`: each one's (pid, tid) and (pid, device) as a code\n"
"(int32 bytearray) into the distinct keys, listed in order of first appearance.\n"
"The device is args.device (None without args), or `scopes_device` where the\n"
"byte of `scopes` is set. A TypeError for an unhashable device (reference.events.slice_keys).");

PyObject *
slice_keys(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *indices, *scopes_device;
    Py_buffer scopes;
    if (!PyArg_ParseTuple(args, "O&O!y*O:slice_keys", events_arg, &events, &PyList_Type,
                          &indices, &scopes, &scopes_device))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(indices);
    PyObject *track_codes = PyByteArray_FromStringAndSize(NULL, n * 4);
    PyObject *group_codes = PyByteArray_FromStringAndSize(NULL, n * 4);
    PyObject *track_keys = PyList_New(0), *group_keys = PyList_New(0);
    PyObject *track_map = PyDict_New(), *group_map = PyDict_New();
    int ok = track_codes && group_codes && track_keys && group_keys && track_map && group_map;
    if (ok && scopes.len != n) {
        PyErr_SetString(PyExc_ValueError, "one scopes flag per index");
        ok = 0;
    }
    const char *scope = scopes.buf;
    Field pid_field = {"pid", NULL, -1}, tid_field = {"tid", NULL, -1};
    Field args_field = {"args", NULL, -1}, device_field = {"device", NULL, -1};
    IntPairs track_pairs = {0}, group_pairs = {0};
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        Py_ssize_t at = event_index(&events, PyList_GET_ITEM(indices, i));
        if (at < 0) {
            ok = 0;
            break;
        }
        PyObject *pid = event_field(&events, at, &pid_field);
        PyObject *tid = pid ? event_field(&events, at, &tid_field) : NULL;
        PyObject *device = NULL;
        if (tid != NULL)
            device = scope[i] ? Py_NewRef(scopes_device)
                              : event_args_field(&events, at, &args_field, &device_field,
                                                 Py_None);
        long track = device ? cached_pair_code(&track_pairs, track_map, track_keys, pid, tid) : -1;
        long group = track >= 0
                         ? cached_pair_code(&group_pairs, group_map, group_keys, pid, device)
                         : -1;
        Py_XDECREF(pid);
        Py_XDECREF(tid);
        Py_XDECREF(device);
        if (group < 0) {
            ok = 0;
            break;
        }
        ((int32_t *)PyByteArray_AS_STRING(track_codes))[i] = (int32_t)track;
        ((int32_t *)PyByteArray_AS_STRING(group_codes))[i] = (int32_t)group;
    }
    PyBuffer_Release(&scopes);
    int_pairs_free(&track_pairs);
    int_pairs_free(&group_pairs);
    Py_XDECREF(track_map);
    Py_XDECREF(group_map);
    if (!ok) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        Py_XDECREF(track_codes);
        Py_XDECREF(group_codes);
        Py_XDECREF(track_keys);
        Py_XDECREF(group_keys);
        return NULL;
    }
    return Py_BuildValue("(NNNN)", track_codes, track_keys, group_codes, group_keys);
}

SHARED_DOC(match_keys_doc,
"match_keys(events, indices) -> (stream codes, stream keys, name codes, name keys)\n\n"
"For the events at `indices` (matched kernels): each one's args.stream (None\n"
"without args) and `name` as a code (int32 bytearray) into the distinct keys\n"
"(type(value), value), listed in order of first appearance, so 1, 1.0 and true\n"
"stay three (reference.events.match_keys). A TypeError for an unhashable stream\n"
"or name.");

PyObject *
match_keys(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *indices;
    if (!PyArg_ParseTuple(args, "O&O!:match_keys", events_arg, &events, &PyList_Type,
                          &indices))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(indices);
    PyObject *stream_codes = PyByteArray_FromStringAndSize(NULL, n * 4);
    PyObject *name_codes = PyByteArray_FromStringAndSize(NULL, n * 4);
    PyObject *stream_keys = PyList_New(0), *name_keys = PyList_New(0);
    PyObject *stream_map = PyDict_New(), *name_map = PyDict_New();
    int ok = stream_codes && name_codes && stream_keys && name_keys && stream_map && name_map;
    Field name_field = {"name", NULL, -1}, args_field = {"args", NULL, -1};
    Field stream_field = {"stream", NULL, -1};
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        Py_ssize_t at = event_index(&events, PyList_GET_ITEM(indices, i));
        PyObject *stream = at >= 0 ? event_args_field(&events, at, &args_field, &stream_field,
                                                      Py_None)
                                   : NULL;
        PyObject *name = stream != NULL ? event_field(&events, at, &name_field) : NULL;
        long stream_code = name != NULL ? pair_code(stream_map, stream_keys,
                                                    (PyObject *)Py_TYPE(stream), stream)
                                        : -1;
        long name_code = stream_code >= 0 ? pair_code(name_map, name_keys,
                                                      (PyObject *)Py_TYPE(name), name)
                                          : -1;
        Py_XDECREF(stream);
        Py_XDECREF(name);
        if (name_code < 0) {
            ok = 0;
            break;
        }
        ((int32_t *)PyByteArray_AS_STRING(stream_codes))[i] = (int32_t)stream_code;
        ((int32_t *)PyByteArray_AS_STRING(name_codes))[i] = (int32_t)name_code;
    }
    Py_XDECREF(stream_map);
    Py_XDECREF(name_map);
    if (!ok) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        Py_XDECREF(stream_codes);
        Py_XDECREF(name_codes);
        Py_XDECREF(stream_keys);
        Py_XDECREF(name_keys);
        return NULL;
    }
    return Py_BuildValue("(NNNN)", stream_codes, stream_keys, name_codes, name_keys);
}

SHARED_DOC(track_keys_doc,
"track_keys(events, indices) -> (track codes, track keys)\n\n"
"For the events at `indices`: each one's (pid, tid) as a code (int32 bytearray)\n"
"into the distinct keys, listed in order of first appearance (slice_keys without\n"
"the groups; reference.events.track_keys).");

PyObject *
track_keys(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *indices;
    if (!PyArg_ParseTuple(args, "O&O!:track_keys", events_arg, &events, &PyList_Type,
                          &indices))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(indices);
    PyObject *codes = PyByteArray_FromStringAndSize(NULL, n * 4);
    PyObject *keys = PyList_New(0), *map = PyDict_New();
    int ok = codes && keys && map;
    Field pid_field = {"pid", NULL, -1}, tid_field = {"tid", NULL, -1};
    IntPairs pairs = {0};
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        Py_ssize_t at = event_index(&events, PyList_GET_ITEM(indices, i));
        PyObject *pid = at >= 0 ? event_field(&events, at, &pid_field) : NULL;
        PyObject *tid = pid ? event_field(&events, at, &tid_field) : NULL;
        long code = tid ? cached_pair_code(&pairs, map, keys, pid, tid) : -1;
        Py_XDECREF(pid);
        Py_XDECREF(tid);
        ok = code >= 0;
        if (ok)
            ((int32_t *)PyByteArray_AS_STRING(codes))[i] = (int32_t)code;
    }
    int_pairs_free(&pairs);
    Py_XDECREF(map);
    if (!ok) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        Py_XDECREF(codes);
        Py_XDECREF(keys);
        return NULL;
    }
    return Py_BuildValue("(NN)", codes, keys);
}

SHARED_DOC(flow_columns_doc,
"flow_columns(events, flows, no_id)\n"
"-> (track codes, track keys, binds next, ids, categories)\n\n"
"For the flow events at `flows`: each one's (pid, tid) as a code (int32 bytearray)\n"
"into the distinct keys, listed in order of first appearance; whether it binds to\n"
"the next slice (ph \"f\" and bp not \"e\", a bool bytearray: model.binds_next);\n"
"its id where that is an int strictly between -2**62 and 2**62, else `no_id`\n"
"(int64 bytearray); and how often each category occurs (str(cat) for one that is\n"
"no string), in order of first appearance (reference.events.flow_columns).");

/* Add one to counts[key]; -1 on error. */
static int
count_key(PyObject *counts, PyObject *key)
{
    PyObject *count = PyDict_GetItemWithError(counts, key);
    PyObject *more = count != NULL ? PyLong_FromSsize_t(PyLong_AsSsize_t(count) + 1)
                     : PyErr_Occurred() ? NULL : PyLong_FromLong(1);
    int stored = more != NULL ? PyDict_SetItem(counts, key, more) : -1;
    Py_XDECREF(more);
    return stored;
}

/* Whether `value` == the string `text` (as Python's == compares); -1 on error. */
static int
equals_text(PyObject *value, PyObject *text)
{
    return PyObject_RichCompareBool(value, text, Py_EQ);
}

PyObject *
flow_columns(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *flows;
    long long no_id;
    if (!PyArg_ParseTuple(args, "O&O!L:flow_columns", events_arg, &events, &PyList_Type,
                          &flows, &no_id))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(flows);
    PyObject *track_codes = PyByteArray_FromStringAndSize(NULL, n * 4);
    PyObject *binds = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *ids = PyByteArray_FromStringAndSize(NULL, n * 8);
    PyObject *track_keys = PyList_New(0), *track_map = PyDict_New();
    PyObject *categories = PyDict_New();
    PyObject *f_text = PyUnicode_FromString("f"), *e_text = PyUnicode_FromString("e");
    int ok = track_codes && binds && ids && track_keys && track_map && categories && f_text
             && e_text;
    Field pid_field = {"pid", NULL, -1}, tid_field = {"tid", NULL, -1};
    Field ph_field = {"ph", NULL, -1}, bp_field = {"bp", NULL, -1};
    Field id_field = {"id", NULL, -1}, cat_field = {"cat", NULL, -1};
    IntPairs pairs = {0};
    for (Py_ssize_t i = 0; ok && i < n; i++) {
        ok = 0;
        Py_ssize_t at = event_index(&events, PyList_GET_ITEM(flows, i));
        if (at < 0)
            break;
        PyObject *pid = event_field(&events, at, &pid_field);
        PyObject *tid = pid ? event_field(&events, at, &tid_field) : NULL;
        long track = tid ? cached_pair_code(&pairs, track_map, track_keys, pid, tid) : -1;
        Py_XDECREF(pid);
        Py_XDECREF(tid);
        if (track < 0)
            break;
        ((int32_t *)PyByteArray_AS_STRING(track_codes))[i] = (int32_t)track;
        int is_f = scanned_is_char(&events, at, F_PH, 'f');
        if (is_f < 0) {
            PyObject *ph = event_field(&events, at, &ph_field);
            is_f = ph != NULL ? equals_text(ph, f_text) : -1;
            Py_XDECREF(ph);
        }
        int next = 0;
        if (is_f > 0) {
            int is_e = scanned_is_char(&events, at, F_BP, 'e');
            if (is_e < 0) {
                PyObject *bp = event_field(&events, at, &bp_field);
                is_e = bp != NULL ? equals_text(bp, e_text) : -1;
                Py_XDECREF(bp);
            }
            if (is_e < 0 && PyErr_Occurred())
                break;
            next = !is_e;
        }
        else if (is_f < 0 && PyErr_Occurred())
            break;
        PyByteArray_AS_STRING(binds)[i] = (char)next;
        int64_t value;
        int packed;
        const Span *span = events.scan != NULL ? &events.scan->col[F_ID][at] : NULL;
        if (span != NULL && (span->type != V_INT || short_int(events.scan->d, span))) {
            /* an int (no bool, no float, no text): read where it lies */
            packed = span->type == V_INT;
            if (packed)
                value = short_int_value(events.scan->d + span->off, span->len);
        } else {
            PyObject *id = event_field(&events, at, &id_field);
            if (id == NULL)
                break;
            packed = exact_int(id, &value);
            Py_DECREF(id);
        }
        packed = packed && value > -(INT64_C(1) << 62) && value < (INT64_C(1) << 62);
        ((int64_t *)PyByteArray_AS_STRING(ids))[i] = packed ? value : (int64_t)no_id;
        PyObject *cat = event_field(&events, at, &cat_field);
        PyObject *key = cat == NULL ? NULL : PyUnicode_Check(cat) ? Py_NewRef(cat)
                                                                 : PyObject_Str(cat);
        Py_XDECREF(cat);
        ok = key != NULL && count_key(categories, key) == 0;
        Py_XDECREF(key);
    }
    int_pairs_free(&pairs);
    Py_XDECREF(track_map);
    Py_XDECREF(f_text);
    Py_XDECREF(e_text);
    if (!ok) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        Py_XDECREF(track_codes);
        Py_XDECREF(binds);
        Py_XDECREF(ids);
        Py_XDECREF(track_keys);
        Py_XDECREF(categories);
        return NULL;
    }
    return Py_BuildValue("(NNNNN)", track_codes, track_keys, binds, ids, categories);
}
