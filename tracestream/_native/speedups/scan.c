/* The scan: a chunk's events read in one pass, without a Python object each (scan_events
   and its Scan type).

   msgspec decodes every event of a chunk into a struct of objects (its phase, category,
   name, pid and tid as new str and int objects, its ts and dur as Raw views, its args as
   another struct), and the index pass then reads a few of those fields of each event
   and frees them all: more than half of the decode's time. `scan_events` validates the
   same JSON in one pass and keeps, per event, where each field's value lies and what
   kind of value it is. A value becomes an object only when a function of the module
   reads it, and then one object per distinct text of the chunk (a chunk has a few
   categories, pids and names among thousands of events).

   It accepts only what msgspec accepts with the same result, and declines (None) the
   rest: a key spelled with escapes, a field given twice, a pid that is no integer of up
   to 18 digits, string or null, a field msgspec decodes as any value (the category, the
   name, args.device, ...) holding a float, a longer integer, an array or an object (msgspec
   refuses numbers out of range there), nesting deeper than MAX_SCAN_DEPTH, a surrogate
   escape.
   The caller then decodes the chunk with msgspec, which says what is wrong, if anything.

   In verify's mode (`origins`) the provenance is read as verify's own struct (model.Origin: an
   object or null, anything else declined) and its pid and tid are fields of their own,
   held to the same rules; the index pass's mode takes it as any value (an object:
   declined).

   The scan is a sequence of its events: `scan[i]` is event i decoded by msgspec (for the
   few events Python code reads one by one). The functions that read events (those of
   events.c, columns.c, keys.c and classify.c) take a list of msgspec structs or a scan
   (see Events in speedups.h). */

#include "speedups.h"

#define MAX_SCAN_DEPTH 64

#define MAX_SPAN ((1 << 28) - 1) /* a longer value: the scan declines */

static inline int
is_hex(unsigned char c)
{
    return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

/* Past the closing quote of the string at p (its opening quote), or NULL where it is
   not valid JSON or holds a surrogate escape; *escaped set where it holds a backslash,
   *high where it holds a byte above 0x7F (a string is the only place one may be). */
static const unsigned char *
string_end(const unsigned char *p, const unsigned char *end, int *escaped, int *high)
{
    p++;
    for (;;) {
#ifdef __SSE2__
        const __m128i quote = _mm_set1_epi8('"'), backslash = _mm_set1_epi8('\\');
        const __m128i control = _mm_set1_epi8(0x1F);
        while (end - p >= 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)p);
            __m128i low = _mm_cmpeq_epi8(_mm_max_epu8(v, control), control); /* <= 0x1F */
            int hits = _mm_movemask_epi8(_mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)), low));
            if (hits) {
                *high |= _mm_movemask_epi8(v) & ((1 << __builtin_ctz(hits)) - 1);
                p += __builtin_ctz(hits);
                break;
            }
            *high |= _mm_movemask_epi8(v);
            p += 16;
        }
#endif
        while (p < end && *p != '"' && *p != '\\' && *p >= 0x20)
            *high |= *p++ & 0x80;
        if (p >= end || *p < 0x20)
            return NULL;
        if (*p == '"')
            return p + 1;
        *escaped = 1;
        if (end - p < 2)
            return NULL;
        unsigned char e = p[1];
        if (e == 'u') {
            if (end - p < 6 || !is_hex(p[2]) || !is_hex(p[3]) || !is_hex(p[4]) || !is_hex(p[5]))
                return NULL;
            if ((p[2] | 0x20) == 'd' && !(p[3] >= '0' && p[3] <= '7'))
                return NULL; /* a surrogate: msgspec decides */
            p += 6;
        } else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n'
                   || e == 'r' || e == 't') {
            p += 2;
        } else {
            return NULL;
        }
    }
}

/* Past the JSON number at p, or NULL; *integer: no fraction and no exponent. */
static const unsigned char *
number_end(const unsigned char *p, const unsigned char *end, int *integer)
{
    *integer = 1;
    if (p < end && *p == '-')
        p++;
    if (p >= end)
        return NULL;
    if (*p == '0')
        p++;
    else if (*p >= '1' && *p <= '9')
        while (p < end && *p >= '0' && *p <= '9')
            p++;
    else
        return NULL;
    if (p < end && *p == '.') {
        *integer = 0;
        const unsigned char *digits = ++p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == digits)
            return NULL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *integer = 0;
        p++;
        if (p < end && (*p == '+' || *p == '-'))
            p++;
        const unsigned char *digits = p;
        while (p < end && *p >= '0' && *p <= '9')
            p++;
        if (p == digits)
            return NULL;
    }
    return p;
}

static const unsigned char *value_end(const unsigned char *p, const unsigned char *end,
                                      int depth, int *type, int *high);

/* Past the array or object at p, validated, or NULL. */
static const unsigned char *
container_end(const unsigned char *p, const unsigned char *end, int depth, int *high)
{
    if (depth > MAX_SCAN_DEPTH)
        return NULL;
    int type, escaped;
    int object = *p == '{';
    p = skip_space(p + 1, end);
    if (p < end && *p == (object ? '}' : ']'))
        return p + 1;
    for (;;) {
        if (object) {
            if (p >= end || *p != '"' || (p = string_end(p, end, &escaped, high)) == NULL)
                return NULL;
            p = skip_space(p, end);
            if (p >= end || *p != ':')
                return NULL;
            p = skip_space(p + 1, end);
        }
        if ((p = value_end(p, end, depth + 1, &type, high)) == NULL)
            return NULL;
        p = skip_space(p, end);
        if (p >= end)
            return NULL;
        if (*p == (object ? '}' : ']'))
            return p + 1;
        if (*p != ',')
            return NULL;
        p = skip_space(p + 1, end);
    }
}

/* Past the JSON value at p, validated, or NULL; its V_* kind in *type. */
static const unsigned char *
value_end(const unsigned char *p, const unsigned char *end, int depth, int *type, int *high)
{
    int escaped = 0, integer;
    if (p >= end)
        return NULL;
    switch (*p) {
    case '"':
        p = string_end(p, end, &escaped, high);
        *type = escaped ? V_ESCAPED : V_STRING;
        return p;
    case '{':
        *type = V_OBJECT;
        return container_end(p, end, depth, high);
    case '[':
        *type = V_ARRAY;
        return container_end(p, end, depth, high);
    case 't':
        *type = V_TRUE;
        return end - p >= 4 && memcmp(p, "true", 4) == 0 ? p + 4 : NULL;
    case 'f':
        *type = V_FALSE;
        return end - p >= 5 && memcmp(p, "false", 5) == 0 ? p + 5 : NULL;
    case 'n':
        *type = V_NULL;
        return end - p >= 4 && memcmp(p, "null", 4) == 0 ? p + 4 : NULL;
    default:
        p = number_end(p, end, &integer);
        *type = integer ? V_INT : V_NUMBER;
        return p;
    }
}

/* The field an event's key names (F_*), or -1. */
static inline int
event_key(const unsigned char *k, Py_ssize_t n)
{
    switch (n) {
    case 2:
        return memcmp(k, "ph", 2) == 0 ? F_PH : memcmp(k, "ts", 2) == 0 ? F_TS
             : memcmp(k, "id", 2) == 0 ? F_ID : memcmp(k, "bp", 2) == 0 ? F_BP : -1;
    case 3:
        return memcmp(k, "cat", 3) == 0 ? F_CAT : memcmp(k, "pid", 3) == 0 ? F_PID
             : memcmp(k, "tid", 3) == 0 ? F_TID : memcmp(k, "dur", 3) == 0 ? F_DUR : -1;
    case 4:
        return memcmp(k, "name", 4) == 0 ? F_NAME : memcmp(k, "args", 4) == 0 ? F_ARGS : -1;
    }
    return -1;
}

/* The field an args key names (F_DEVICE, F_STREAM, F_PROVENANCE), or -1. */
static inline int
args_key(const unsigned char *k, Py_ssize_t n)
{
    if (n == 6)
        return memcmp(k, "device", 6) == 0 ? F_DEVICE : memcmp(k, "stream", 6) == 0 ? F_STREAM
                                                                                  : -1;
    return n == PROVENANCE_KEY_LEN && memcmp(k, PROVENANCE_KEY, n) == 0 ? F_PROVENANCE : -1;
}

/* Whether a field's value is of a kind its msgspec type takes as the scan reads it
   (`origins`: the provenance is verify's struct of pid and tid, see scan_events). */
static inline int
scan_type_ok(const unsigned char *d, int field, const Span *span, int origins)
{
    if (field == F_PROVENANCE && origins) /* Origin | None */
        return span->type == V_OBJECT || span->type == V_NULL;
    switch (field) {
    case F_PH: /* str | None */
        return span->type == V_STRING || span->type == V_ESCAPED || span->type == V_NULL;
    case F_PID:
    case F_TID: /* int | str | None */
        return span->type == V_STRING || span->type == V_ESCAPED || span->type == V_NULL
               || short_int(d, span);
    case F_ARGS: /* _Args | None */
        return span->type == V_OBJECT || span->type == V_NULL;
    case F_TS:
    case F_DUR: /* Raw: the text, whatever it is */
        return 1;
    }
    /* Any: decoded by msgspec, which refuses numbers out of range, also inside arrays and
       objects; the scan keeps strings, ints of 64 bits, null, true and false */
    return span->type == V_STRING || span->type == V_ESCAPED || span->type == V_NULL
           || span->type == V_TRUE || span->type == V_FALSE || short_int(d, span);
}

enum { IN_EVENT, IN_ARGS, IN_ORIGIN }; /* the object scan_object reads */

/* The field a key of the provenance names (F_ORIGIN_PID, F_ORIGIN_TID), or -1. */
static inline int
origin_key(const unsigned char *k, Py_ssize_t n)
{
    return n != 3 ? -1 : memcmp(k, "pid", 3) == 0 ? F_ORIGIN_PID
                       : memcmp(k, "tid", 3) == 0 ? F_ORIGIN_TID : -1;
}

/* Past the object at p (an event, its args or, where `origins`, its args' provenance:
   `level`), its fields' spans in `fields` (offsets from `base`), or NULL where the scan
   declines. */
static const unsigned char *
scan_object(const unsigned char *base, const unsigned char *p, const unsigned char *end,
            Span *fields, int level, int origins, int *high)
{
    p = skip_space(p + 1, end);
    if (p < end && *p == '}')
        return p + 1;
    for (;;) {
        int escaped = 0, type;
        if (p >= end || *p != '"')
            return NULL;
        const unsigned char *key = p + 1;
        if ((p = string_end(p, end, &escaped, high)) == NULL || escaped)
            return NULL; /* an escaped key may spell a field */
        Py_ssize_t key_len = p - 1 - key;
        int field = level == IN_EVENT ? event_key(key, key_len)
                    : level == IN_ARGS  ? args_key(key, key_len)
                                        : origin_key(key, key_len);
        p = skip_space(p, end);
        if (p >= end || *p != ':')
            return NULL;
        p = skip_space(p + 1, end);
        const unsigned char *value = p;
        if (field >= 0 && fields[field].type != V_ABSENT)
            return NULL; /* given twice */
        if ((field == F_ARGS || (field == F_PROVENANCE && origins)) && p < end && *p == '{') {
            p = scan_object(base, p, end, fields, level + 1, origins, high);
            type = V_OBJECT;
        } else {
            p = value_end(p, end, 2 + level, &type, high);
        }
        if (p == NULL)
            return NULL;
        if (field >= 0) {
            Span *span = &fields[field];
            if (p - value > MAX_SPAN)
                return NULL;
            span->off = (int32_t)(value - base);
            span->len = (uint32_t)(p - value);
            span->type = (uint32_t)type;
            if (!scan_type_ok(base, field, span, origins))
                return NULL;
        }
        p = skip_space(p, end);
        if (p >= end)
            return NULL;
        if (*p == '}')
            return p + 1;
        if (*p != ',')
            return NULL;
        p = skip_space(p + 1, end);
    }
}

static PyMemberDef scanned_members[] = {
    {"ascii", T_BOOL, offsetof(Scanned, ascii), READONLY,
     PyDoc_STR("whether the chunk is all ASCII (else its caller checks it is UTF-8)")},
    {NULL, 0, 0, 0, NULL},
};

static void
scanned_dealloc(Scanned *s)
{
    for (Py_ssize_t j = 0; j < s->table_used; j++)
        Py_DECREF(s->values[j]);
    for (int k = 0; k < INT_CACHE; k++)
        Py_XDECREF(s->int_value[k]);
    for (int k = 0; k < SCAN_FIELDS; k++)
        PyMem_Free(s->memo[k]);
    PyMem_Free(s->values);
    PyMem_Free(s->table);
    PyMem_Free(s->starts);
    PyMem_Free(s->ends);
    for (int k = 0; k < SCAN_FIELDS; k++)
        PyMem_Free(s->col[k]);
    if (s->view.obj != NULL)
        PyBuffer_Release(&s->view);
    Py_XDECREF(s->decode_value);
    Py_XDECREF(s->decode_event);
    Py_XDECREF(s->unset);
    Py_XDECREF(s->empty);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static Py_ssize_t
scanned_length(Scanned *s)
{
    return s->n;
}

/* scan[i]: event i as msgspec decodes it on its own. */
static PyObject *
scanned_item(Scanned *s, Py_ssize_t i)
{
    if (i < 0 || i >= s->n) {
        PyErr_SetString(PyExc_IndexError, "scan index out of range");
        return NULL;
    }
    PyObject *text = PyBytes_FromStringAndSize((const char *)s->d + s->starts[i],
                                               s->ends[i] - s->starts[i]);
    if (text == NULL)
        return NULL;
    PyObject *event = PyObject_CallOneArg(s->decode_event, text);
    Py_DECREF(text);
    return event;
}

/* scan.spans(): each event's (start, end) in the chunk, as int64 bytearrays. */
static PyObject *
scanned_spans(Scanned *s, PyObject *unused)
{
    PyObject *starts = PyByteArray_FromStringAndSize(NULL, s->n * 8);
    PyObject *ends = PyByteArray_FromStringAndSize(NULL, s->n * 8);
    if (starts == NULL || ends == NULL) {
        Py_XDECREF(starts);
        Py_XDECREF(ends);
        return NULL;
    }
    int64_t *start = (int64_t *)PyByteArray_AS_STRING(starts);
    int64_t *end = (int64_t *)PyByteArray_AS_STRING(ends);
    for (Py_ssize_t i = 0; i < s->n; i++) {
        start[i] = s->starts[i] - s->shift;
        end[i] = s->ends[i] - s->shift;
    }
    return Py_BuildValue("(NN)", starts, ends);
}

static PyMethodDef scanned_methods[] = {
    {"spans", (PyCFunction)scanned_spans, METH_NOARGS,
     PyDoc_STR("spans() -> (starts, ends): each event's bytes in the chunk (int64 bytearrays)")},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods scanned_as_sequence = {
    .sq_length = (lenfunc)scanned_length,
    .sq_item = (ssizeargfunc)scanned_item,
};

PyTypeObject ScannedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracestream._native._speedups.Scan",
    .tp_doc = PyDoc_STR("A chunk's events as scan_events read them (see there)."),
    .tp_basicsize = sizeof(Scanned),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)scanned_dealloc,
    .tp_as_sequence = &scanned_as_sequence,
    .tp_methods = scanned_methods,
    .tp_members = scanned_members,
};

static inline uint64_t
text_hash(const unsigned char *p, Py_ssize_t n)
{
    uint64_t h = UINT64_C(0x9E3779B97F4A7C15) ^ (uint64_t)n, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * UINT64_C(0xFF51AFD7ED558CCD);
        h ^= h >> 32;
    }
    if (n >= 4) { /* the last 4 to 7 bytes, as two loads that may overlap */
        uint32_t a, b;
        memcpy(&a, p, 4);
        memcpy(&b, p + n - 4, 4);
        w = ((uint64_t)a << 32) | b;
    } else {
        w = n ? ((uint64_t)p[0] << 16) | ((uint64_t)p[n / 2] << 8) | p[n - 1] : 0;
    }
    h = (h ^ w) * UINT64_C(0xC4CEB9FE1A85EC53);
    return h ^ (h >> 29);
}

/* An int of the value (a new reference), kept for the next use of the same value: a
   chunk's pids, tids, devices and streams are a few values, read event after event. */
static PyObject *
cached_int(Scanned *s, int64_t value)
{
    int k = (int)(((uint64_t)value * UINT64_C(0x9E3779B97F4A7C15)) >> 58);
    if (s->int_value[k] != NULL && s->int_key[k] == value)
        return Py_NewRef(s->int_value[k]);
    PyObject *number = PyLong_FromLongLong(value);
    if (number == NULL)
        return NULL;
    Py_XSETREF(s->int_value[k], Py_NewRef(number));
    s->int_key[k] = value;
    return number;
}

/* The str of field `field` of event i, a string without escapes: one object per distinct
   text (a borrowed reference, held by the scan), or NULL with an exception. Each event's
   is remembered, since several functions read the same names and keys. */
static PyObject *
interned_value(Scanned *s, Py_ssize_t i, int field, const Span *span)
{
    if (s->memo[field] == NULL) {
        if ((s->memo[field] = PyMem_Malloc(s->n * sizeof(int32_t))) == NULL)
            return PyErr_NoMemory();
        memset(s->memo[field], 0xFF, s->n * sizeof(int32_t)); /* -1 */
    }
    if (s->memo[field][i] >= 0)
        return s->values[s->memo[field][i]];
    if (2 * (s->table_used + 1) > s->table_size) {
        Py_ssize_t size = s->table_size ? 2 * s->table_size : 256;
        Interned *table = PyMem_Malloc(size * sizeof(Interned));
        PyObject **values = PyMem_Realloc(s->values, (size / 2) * sizeof(PyObject *));
        if (values != NULL)
            s->values = values;
        if (table == NULL || values == NULL) {
            PyMem_Free(table);
            return PyErr_NoMemory();
        }
        for (Py_ssize_t k = 0; k < size; k++)
            table[k].value = -1;
        for (Py_ssize_t j = 0; j < s->table_size; j++) {
            if (s->table[j].value < 0)
                continue;
            Py_ssize_t k = (Py_ssize_t)(s->table[j].hash & (uint64_t)(size - 1));
            while (table[k].value >= 0)
                k = (k + 1) & (size - 1);
            table[k] = s->table[j];
        }
        PyMem_Free(s->table);
        s->table = table;
        s->table_size = size;
    }
    const unsigned char *text = s->d + span->off;
    uint64_t hash = text_hash(text, span->len);
    Py_ssize_t k = (Py_ssize_t)(hash & (uint64_t)(s->table_size - 1));
    for (; s->table[k].value >= 0; k = (k + 1) & (s->table_size - 1)) {
        const Interned *entry = &s->table[k];
        if (entry->hash == hash && entry->len == span->len
            && memcmp(s->d + entry->off, text, span->len) == 0)
            return s->values[s->memo[field][i] = entry->value];
    }
    PyObject *value = PyUnicode_DecodeUTF8((const char *)text + 1, span->len - 2, NULL);
    if (value == NULL)
        return NULL;
    int32_t number = (int32_t)s->table_used++;
    s->values[number] = value;
    s->table[k] = (Interned){hash, span->off, span->len, number};
    s->memo[field][i] = number;
    return value;
}

/* The value of field `field` of event i as msgspec gives it (a new reference), or NULL
   with an exception. Not for F_ARGS itself. */
PyObject *
scanned_value(Scanned *s, Py_ssize_t i, int field)
{
    const Span *span = &s->col[field][i];
    if (field == F_TS || field == F_DUR) /* msgspec.Raw: the text */
        return span->type == V_ABSENT
                   ? Py_NewRef(s->empty)
                   : PyBytes_FromStringAndSize((const char *)s->d + span->off, span->len);
    switch (span->type) {
    case V_ABSENT:
        return Py_NewRef(field == F_PROVENANCE ? s->unset : Py_None);
    case V_NULL:
        Py_RETURN_NONE;
    case V_TRUE:
        Py_RETURN_TRUE;
    case V_FALSE:
        Py_RETURN_FALSE;
    case V_STRING:
        if (span->len == 3) /* one character, ASCII (the chunk is UTF-8): a cached str */
            return PyUnicode_FromOrdinal(s->d[span->off + 1]);
        return Py_XNewRef(interned_value(s, i, field, span));
    case V_INT:
        if (short_int(s->d, span))
            return cached_int(s, short_int_value(s->d + span->off, span->len));
    }
    PyObject *text = PyBytes_FromStringAndSize((const char *)s->d + span->off, span->len);
    PyObject *value = text != NULL ? PyObject_CallOneArg(s->decode_value, text) : NULL;
    Py_XDECREF(text);
    return value;
}

SHARED_DOC(scan_events_doc,
"scan_events(document, decode_value, decode_event, unset, bracketed, origins=False)\n"
"-> Scan or None\n\n"
"A chunk's events (bytes-like: a JSON array where `bracketed`, else the events and\n"
"the commas between them), validated and read in one pass, or\n"
"None where the scan declines (see the comment above scan_events in the source):\n"
"its `ascii` is False where a string holds a byte above 0x7F: the caller then checks\n"
"the chunk is UTF-8 before it reads a value (the scan does not).\n"
"decode it with msgspec then. The scan is a sequence of the events; functions of\n"
"this module that read events' fields take it as they take a list of msgspec structs\n"
"(model.Event). `decode_value(text)` gives a field's value where the scan keeps\n"
"none of its own (escaped strings, floats, objects), `decode_event(text)` an event,\n"
"`unset` the provenance of args without one.\n"
"`origins`: read the provenance as verify's struct (model.Origin: an object or null,\n"
"its pid and tid kept as fields of their own, any value msgspec takes there) instead of\n"
"as any value (an object: declined).");

PyObject *
scan_events(PyObject *module, PyObject *args)
{
    PyObject *document, *decode_value, *decode_event, *unset;
    int bracketed, origins = 0;
    if (!PyArg_ParseTuple(args, "OOOOp|p:scan_events", &document, &decode_value, &decode_event,
                          &unset, &bracketed, &origins))
        return NULL;
    Scanned *s = PyObject_New(Scanned, &ScannedType);
    if (s == NULL)
        return NULL;
    memset((char *)s + sizeof(PyObject), 0, sizeof(Scanned) - sizeof(PyObject));
    if (PyObject_GetBuffer(document, &s->view, PyBUF_SIMPLE) < 0) {
        s->view.obj = NULL;
        Py_DECREF(s);
        return NULL;
    }
    s->decode_value = Py_NewRef(decode_value);
    s->decode_event = Py_NewRef(decode_event);
    s->unset = Py_NewRef(unset);
    if ((s->empty = PyBytes_FromStringAndSize(NULL, 0)) == NULL) {
        Py_DECREF(s);
        return NULL;
    }
    const unsigned char *d = s->view.buf, *end = d + s->view.len;
    s->d = d;
    if (s->view.len > INT32_MAX)
        goto decline;
    Py_ssize_t cap = 0;
    int high = 0;
    const unsigned char *p = skip_space(d, end);
    s->shift = bracketed;
    s->origins = (char)origins;
    s->fields = origins ? SCAN_FIELDS : F_ORIGIN_PID;
    if (bracketed) {
        if (p >= end || *p != '[')
            goto decline;
        p = skip_space(p + 1, end);
    }
    if (bracketed ? p < end && *p == ']' : p >= end) { /* no events */
        p += bracketed;
    } else {
        for (;;) {
            if (p >= end || *p != '{')
                goto decline;
            if (s->n == cap) {
                cap = cap ? 2 * cap : 4096;
                int64_t *starts = PyMem_Realloc(s->starts, cap * sizeof(int64_t));
                if (starts != NULL)
                    s->starts = starts;
                int64_t *ends = PyMem_Realloc(s->ends, cap * sizeof(int64_t));
                if (ends != NULL)
                    s->ends = ends;
                int columns = 0;
                for (int k = 0; k < s->fields; k++) {
                    Span *column = PyMem_Realloc(s->col[k], cap * sizeof(Span));
                    if (column != NULL) {
                        s->col[k] = column;
                        columns++;
                    }
                }
                if (starts == NULL || ends == NULL || columns < s->fields) {
                    Py_DECREF(s);
                    return PyErr_NoMemory();
                }
            }
            Span fields[SCAN_FIELDS] = {{0}};
            s->starts[s->n] = p - d;
            if ((p = scan_object(d, p, end, fields, IN_EVENT, origins, &high)) == NULL)
                goto decline;
            for (int k = 0; k < s->fields; k++)
                s->col[k][s->n] = fields[k];
            s->ends[s->n++] = p - d;
            p = skip_space(p, end);
            if (!bracketed && p == end)
                break;
            if (p >= end)
                goto decline;
            if (bracketed && *p == ']') {
                p++;
                break;
            }
            if (*p != ',')
                goto decline;
            p = skip_space(p + 1, end);
        }
    }
    if (skip_space(p, end) != end)
        goto decline;
    s->ascii = !high;
    return (PyObject *)s;

decline:
    Py_DECREF(s);
    Py_RETURN_NONE;
}
