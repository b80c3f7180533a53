/* Events' fields read as columns: event_values, decimal_column (a ts or dur column) and
   verify's check_columns. */

#include "speedups.h"

SHARED_DOC(event_values_doc,
"event_values(events, indices, key) -> list\n\n"
"events[i].<key> for each of the indices (a list of msgspec structs or a scan, whose\n"
"ts and dur are bytes where msgspec gives a Raw): a scan reads these where they lie,\n"
"its events one by one are decoded whole.");

PyObject *
event_values(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *indices;
    Field field = {NULL, NULL, -1};
    if (!PyArg_ParseTuple(args, "O&O!s:event_values", events_arg, &events, &PyList_Type,
                          &indices, &field.name))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(indices);
    PyObject *out = PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        Py_ssize_t at = event_index(&events, PyList_GET_ITEM(indices, i));
        PyObject *value = at >= 0 ? event_field(&events, at, &field) : NULL;
        if (value == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, value);
    }
    return out;
}

SHARED_DOC(decimal_column_doc,
"decimal_column(events, key, signed) -> (ns, shapes)\n\n"
"The events' `key` field (msgspec.Raw number texts, empty where absent) as a ts or\n"
"dur column, each value by its own shape: 0 absent, 1 an integer, 2 a number with\n"
"one to three decimals (exact in ns: Kineto's shapes and floats such as 68.0; below\n"
"9e15 us, not negative unless `signed`),\n"
"3 anything else (read one by one by the caller). Gives the values in ns (int64\n"
"bytearray, 0 where absent or of shape 3) and the shapes (a bytearray), so one odd\n"
"value costs its own event, not its chunk (reference.columns.kineto_column).");

#define MAX_WHOLE_DIGITS 16 /* integer digits of a value below 9e15 us */
#define MAX_FAST_DECIMALS 3 /* decimals of a value exact in ns (reference.columns.MAX_FAST_DECIMALS) */
enum { SHAPE_ABSENT, SHAPE_INTEGER, SHAPE_DECIMAL, SHAPE_OTHER };

PyObject *
decimal_column(PyObject *module, PyObject *args)
{
    Events events;
    Field field = {NULL, NULL, -1};
    int is_signed;
    if (!PyArg_ParseTuple(args, "O&sp:decimal_column", events_arg, &events, &field.name,
                          &is_signed))
        return NULL;
    Py_ssize_t n = events.size;
    int column = events.scan != NULL ? field_column(&field) : -1;
    if (events.scan != NULL && column != F_TS && column != F_DUR) {
        PyErr_Format(PyExc_ValueError, "no number column `%s` in a scan", field.name);
        return NULL;
    }
    PyObject *ns_obj = PyByteArray_FromStringAndSize(NULL, n * 8);
    PyObject *shapes_obj = PyByteArray_FromStringAndSize(NULL, n);
    if (ns_obj == NULL || shapes_obj == NULL)
        goto fail;
    int64_t *ns = (int64_t *)PyByteArray_AS_STRING(ns_obj);
    char *shapes = PyByteArray_AS_STRING(shapes_obj);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer view = {0};
        if (events.scan != NULL) { /* the text where it lies in the scanned document */
            const Span *span = &events.scan->col[column][i];
            view.buf = (void *)(events.scan->d + span->off);
            view.len = span->type == V_ABSENT ? 0 : span->len;
        } else {
            PyObject *text = read_field(PyList_GET_ITEM(events.list, i), &field);
            int viewed = text != NULL ? PyObject_GetBuffer(text, &view, PyBUF_SIMPLE) : -1;
            Py_XDECREF(text); /* the event holds the text while it is viewed */
            if (viewed < 0)
                goto fail;
        }
        const unsigned char *t = view.buf;
        Py_ssize_t len = view.len, at = 0;
        int decimals = 0, ok = 1, negative = 0;
        int64_t value = 0;
        ns[i] = 0;
        if (len == 0) {
            shapes[i] = SHAPE_ABSENT;
            PyBuffer_Release(&view);
            continue;
        }
        if (t[0] == '-') {
            negative = 1;
            at = 1;
            ok = is_signed;
        }
        for (int d = 1; !decimals && d <= MAX_FAST_DECIMALS; d++) {
            if (len >= d + 2 && t[len - 1 - d] == '.')
                decimals = d;
        }
        Py_ssize_t whole = len - at - (decimals ? decimals + 1 : 0);
        if (whole < 1 || whole > MAX_WHOLE_DIGITS
            || (whole == MAX_WHOLE_DIGITS && t[at] > '8'))
            ok = 0;
        for (Py_ssize_t k = at; ok && k < len; k++) {
            if (t[k] >= '0' && t[k] <= '9')
                value = 10 * value + (t[k] - '0');
            else if (!(decimals && k == len - 1 - decimals))
                ok = 0;
        }
        PyBuffer_Release(&view);
        if (!ok) {
            shapes[i] = SHAPE_OTHER;
            continue;
        }
        shapes[i] = decimals ? SHAPE_DECIMAL : SHAPE_INTEGER;
        for (int d = decimals; d < 3; d++)
            value *= 10; /* to ns: 1000 for an integer, 100 for one decimal, ... */
        ns[i] = negative ? -value : value;
    }
    return Py_BuildValue("(NN)", ns_obj, shapes_obj);

fail:
    Py_XDECREF(ns_obj);
    Py_XDECREF(shapes_obj);
    return NULL;
}

/* The number of `value` among `numbers` (a dict: value -> number), appended to `values`
   with the next number when new (reference.columns.numbered); -1 with an exception (an
   unhashable value). */
static Py_ssize_t
interned(PyObject *numbers, PyObject *values, PyObject *value)
{
    PyObject *found = PyDict_GetItemWithError(numbers, value);
    if (found != NULL)
        return PyLong_AsSsize_t(found);
    if (PyErr_Occurred())
        return -1;
    Py_ssize_t number = PyList_GET_SIZE(values);
    PyObject *boxed = PyLong_FromSsize_t(number);
    int failed = boxed == NULL || PyDict_SetItem(numbers, value, boxed) < 0
                 || PyList_Append(values, value) < 0;
    Py_XDECREF(boxed);
    return failed ? -1 : number;
}

/* The track code of a pid and a tid (new references, released here; NULL: an error
   already set): the pid's number in the high half, the tid's in the low one
   (verify's TrackCodes); -1 with an exception. */
static int64_t
track_code(PyObject *pid, PyObject *tid, PyObject *pids[2], PyObject *tids[2])
{
    Py_ssize_t p = pid != NULL && tid != NULL ? interned(pids[0], pids[1], pid) : -1;
    Py_ssize_t t = p >= 0 ? interned(tids[0], tids[1], tid) : -1;
    Py_XDECREF(pid);
    Py_XDECREF(tid);
    return t >= 0 ? ((int64_t)p << 32) | t : -1;
}

enum { CHECK_OTHER, CHECK_SLICE, CHECK_FLOW }; /* verify's phase codes */

/* The fields check_columns reads of a list's structs beyond the event's own: its args'
   provenance (model.Origin) and that one's pid and tid. */
typedef struct {
    Field args, origin, pid, tid;
} OriginFields;

/* The original track code of moved event i: its provenance's pid and tid. */
static int64_t
origin_code(Events *events, Py_ssize_t i, OriginFields *f, PyObject *pids[2],
            PyObject *tids[2])
{
    if (events->scan != NULL)
        return track_code(scanned_value(events->scan, i, F_ORIGIN_PID),
                          scanned_value(events->scan, i, F_ORIGIN_TID), pids, tids);
    PyObject *event_args = read_field(PyList_GET_ITEM(events->list, i), &f->args);
    PyObject *origin = event_args != NULL ? read_field(event_args, &f->origin) : NULL;
    Py_XDECREF(event_args);
    if (origin == NULL)
        return -1;
    PyObject *pid = read_field(origin, &f->pid);
    PyObject *tid = pid != NULL ? read_field(origin, &f->tid) : NULL;
    Py_DECREF(origin);
    return track_code(pid, tid, pids, tids);
}

/* Whether event i is moved (its args hold a provenance that is not null): 1, 0, or -1
   with an exception. */
static int
is_moved(Events *events, Py_ssize_t i, OriginFields *f)
{
    if (events->scan != NULL)
        return events->scan->col[F_ARGS][i].type == V_OBJECT
               && events->scan->col[F_PROVENANCE][i].type == V_OBJECT;
    PyObject *event_args = read_field(PyList_GET_ITEM(events->list, i), &f->args);
    if (event_args == NULL || event_args == Py_None) {
        Py_XDECREF(event_args);
        return event_args == NULL ? -1 : 0;
    }
    PyObject *origin = read_field(event_args, &f->origin);
    Py_DECREF(event_args);
    if (origin == NULL)
        return -1;
    Py_DECREF(origin);
    return origin != Py_None;
}

SHARED_DOC(check_columns_doc,
"check_columns(events, kinds, activity, (pid numbers, pid values),\n"
"              (tid numbers, tid values), (device numbers, device values))\n"
"-> (phases, kinds, tracks, origins, moved, devices)\n\n"
"What verify's output-only checks read of a chunk's decoded events (a list of\n"
"model.CheckEvent, or their scan_events with `origins`), per event: the phase (int8: 1\n"
"for X, 2 for s, t and f, else 0); the kind (int8:\n"
"kinds[cat] for X, else 0); the track (int64: the pid's number << 32 | the tid's); the\n"
"original track (the provenance's pid and tid, for a moved flow or a moved X event of\n"
"an `activity` kind (bytes: 1 at such a kind), else the track); whether it is moved\n"
"(args and its provenance present, bool); the number of args.device for an X event of\n"
"an activity kind (None without args), else -1 (int64). Values are numbered as\n"
"reference.columns.numbered numbers them (the dicts and lists are its own, extended in place):\n"
"every event's pid and tid, then the provenances', then the devices, in event order.\n"
"A TypeError for an unhashable category, provenance pid or tid, or device.");

PyObject *
check_columns(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *kinds, *pids[2], *tids[2], *devices[2];
    Py_buffer activity;
    if (!PyArg_ParseTuple(args, "O&O!y*(O!O!)(O!O!)(O!O!):check_columns", events_arg,
                          &events, &PyDict_Type, &kinds, &activity, &PyDict_Type, &pids[0],
                          &PyList_Type, &pids[1], &PyDict_Type, &tids[0], &PyList_Type,
                          &tids[1], &PyDict_Type, &devices[0], &PyList_Type, &devices[1]))
        return NULL;
    if (events.scan != NULL && !events.scan->origins) {
        PyBuffer_Release(&activity);
        PyErr_SetString(PyExc_ValueError, "check_columns reads a scan made with `origins`");
        return NULL;
    }
    Py_ssize_t n = events.size;
    PyObject *phases = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *kind_codes = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *tracks = PyByteArray_FromStringAndSize(NULL, n * 8);
    PyObject *origins = PyByteArray_FromStringAndSize(NULL, n * 8);
    PyObject *moves = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *device_codes = PyByteArray_FromStringAndSize(NULL, n * 8);
    PyObject *value = NULL;
    if (phases == NULL || kind_codes == NULL || tracks == NULL || origins == NULL
        || moves == NULL || device_codes == NULL)
        goto fail;
    char *phase = PyByteArray_AS_STRING(phases), *kind = PyByteArray_AS_STRING(kind_codes);
    char *moved = PyByteArray_AS_STRING(moves);
    int64_t *track = (int64_t *)PyByteArray_AS_STRING(tracks);
    int64_t *origin = (int64_t *)PyByteArray_AS_STRING(origins);
    int64_t *device = (int64_t *)PyByteArray_AS_STRING(device_codes);
    const unsigned char *is_activity = activity.buf;
    Field ph_field = {"ph", NULL, -1}, cat_field = {"cat", NULL, -1};
    Field pid_field = {"pid", NULL, -1}, tid_field = {"tid", NULL, -1};
    Field args_field = {"args", NULL, -1}, device_field = {"device", NULL, -1};
    OriginFields origin_fields = {{"args", NULL, -1}, {"origin", NULL, -1}, {"pid", NULL, -1},
                                  {"tid", NULL, -1}};
    /* the events' own fields, their tracks numbered first */
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XSETREF(value, event_field(&events, i, &ph_field));
        if (value == NULL)
            goto fail;
        phase[i] = CHECK_OTHER;
        if (PyUnicode_Check(value) && PyUnicode_GET_LENGTH(value) == 1) {
            Py_UCS4 c = PyUnicode_READ_CHAR(value, 0);
            phase[i] = c == 'X' ? CHECK_SLICE : (c == 's' || c == 't' || c == 'f') ? CHECK_FLOW
                                                                                 : CHECK_OTHER;
        }
        PyObject *pid = event_field(&events, i, &pid_field);
        PyObject *tid = pid != NULL ? event_field(&events, i, &tid_field) : NULL;
        int move = (track[i] = track_code(pid, tid, pids, tids)) < 0
                       ? -1 : is_moved(&events, i, &origin_fields);
        if (move < 0)
            goto fail;
        moved[i] = (char)move;
        kind[i] = 0;
        if (phase[i] != CHECK_SLICE)
            continue;
        Py_XSETREF(value, event_field(&events, i, &cat_field));
        if (value == NULL)
            goto fail;
        PyObject *found = PyDict_GetItemWithError(kinds, value);
        if (found != NULL) {
            kind[i] = (char)PyLong_AsLong(found);
            continue;
        }
        if (PyErr_Occurred() || (found = PyObject_GetItem(kinds, value)) == NULL)
            goto fail; /* (the dict's __missing__ classifies a new category) */
        kind[i] = (char)PyLong_AsLong(found);
        Py_DECREF(found);
    }
    /* the original tracks of moved flows and activities */
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char k = (unsigned char)kind[i];
        int active = phase[i] == CHECK_SLICE && k < activity.len && is_activity[k];
        origin[i] = track[i];
        if (moved[i] && (active || phase[i] == CHECK_FLOW)
            && (origin[i] = origin_code(&events, i, &origin_fields, pids, tids)) < 0)
            goto fail;
    }
    /* the devices of activities */
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char k = (unsigned char)kind[i];
        device[i] = -1;
        if (!(phase[i] == CHECK_SLICE && k < activity.len && is_activity[k]))
            continue;
        Py_XSETREF(value, event_args_field(&events, i, &args_field, &device_field, Py_None));
        if (value == NULL || (device[i] = interned(devices[0], devices[1], value)) < 0)
            goto fail;
    }
    Py_XDECREF(value);
    PyBuffer_Release(&activity);
    return Py_BuildValue("(NNNNNN)", phases, kind_codes, tracks, origins, moves, device_codes);

fail:
    Py_XDECREF(value);
    PyBuffer_Release(&activity);
    Py_XDECREF(phases);
    Py_XDECREF(kind_codes);
    Py_XDECREF(tracks);
    Py_XDECREF(origins);
    Py_XDECREF(moves);
    Py_XDECREF(device_codes);
    return NULL;
}
