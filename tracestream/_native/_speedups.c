/* The per-chunk work of both passes that numpy and per-event Python did, in C: byte
   scans of a chunk, reading the decoded events' fields, and the rewrite's splice.

   Each function returns exactly what the code it stands in for in the index, write
   and commands packages returns (the tests compare the two). That code stays the
   reference, and the package works without this module: setup.py builds it as an
   optional extension, and tracestream/_native/__init__.py says which one runs.

   Positions come back as bytearrays of native int64, for np.frombuffer. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* The key of a relocated event's provenance member (events.PROVENANCE_KEY). */
static const char PROVENANCE_KEY[] = "_compact_gpu_track";
#define PROVENANCE_KEY_LEN ((Py_ssize_t)sizeof PROVENANCE_KEY - 1)

/* A growing array of positions. */
typedef struct {
    int64_t *items;
    Py_ssize_t len, cap;
} Positions;

static int
push(Positions *p, int64_t value)
{
    if (p->len == p->cap) {
        Py_ssize_t cap = p->cap ? 2 * p->cap : 4096;
        int64_t *items = PyMem_Realloc(p->items, cap * sizeof(int64_t));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        p->items = items;
        p->cap = cap;
    }
    p->items[p->len++] = value;
    return 0;
}

/* The positions as a bytearray (the array is freed either way). */
static PyObject *
as_bytearray(Positions *p)
{
    PyObject *out = PyByteArray_FromStringAndSize(
        p->len ? (const char *)p->items : NULL, p->len * (Py_ssize_t)sizeof(int64_t));
    PyMem_Free(p->items);
    p->items = NULL;
    return out;
}

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

PyDoc_STRVAR(separators_doc,
"separators(data) -> (closes, opens)\n\n"
"Every `}` ws* `,` ws* `{` in data: the offset of its `}` and the offset after\n"
"its `{`, as int64 bytearrays (keyscan.separators).");

static PyObject *
separators(PyObject *module, PyObject *arg)
{
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *start = buf.buf, *end = start + buf.len, *p = start;
    Positions closes = {0}, opens = {0};
    int failed = 0;
    while (!failed && p < end && (p = memchr(p, '}', end - p)) != NULL) {
        const unsigned char *q = skip_space(p + 1, end);
        if (q < end && *q == ',') {
            q = skip_space(q + 1, end);
            if (q < end && *q == '{')
                failed = push(&closes, p - start) || push(&opens, q + 1 - start);
        }
        p++;
    }
    PyBuffer_Release(&buf);
    if (failed) {
        PyMem_Free(closes.items);
        PyMem_Free(opens.items);
        return NULL;
    }
    PyObject *c = as_bytearray(&closes), *o = as_bytearray(&opens);
    if (c == NULL || o == NULL) {
        Py_XDECREF(c);
        Py_XDECREF(o);
        return NULL;
    }
    return Py_BuildValue("(NN)", c, o);
}

/* An int64 column given as a buffer, of `count` items (any number when count < 0). */
static int
column(PyObject *obj, Py_buffer *view, Py_ssize_t count, const char *name)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *format = view->format ? view->format : "B";
    if (format[0] == '<' || format[0] == '=')
        format++;
    if (view->itemsize != 8 || (count >= 0 && view->len != count * 8)
        || (strcmp(format, "l") != 0 && strcmp(format, "q") != 0)) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s must be contiguous int64", name);
        return -1;
    }
    return 0;
}

#define MAX_LITERALS 32

/* Literals that start with `"`, ready to be looked for. */
typedef struct {
    Py_ssize_t count;
    const char *text[MAX_LITERALS];
    Py_ssize_t size[MAX_LITERALS];
    uint32_t second[256]; /* per second byte: the literals that have it */
    int letters;          /* how many distinct second bytes */
    unsigned char letter[8];  /* the first eight of them */
} Literals;

static int
literals_from(PyObject *tuple, Literals *lits)
{
    memset(lits, 0, sizeof *lits);
    lits->count = PyTuple_GET_SIZE(tuple);
    if (lits->count > MAX_LITERALS) {
        PyErr_Format(PyExc_ValueError, "at most %d literals at a time", MAX_LITERALS);
        return -1;
    }
    for (Py_ssize_t k = 0; k < lits->count; k++) {
        PyObject *item = PyTuple_GET_ITEM(tuple, k);
        if (!PyBytes_Check(item) || PyBytes_GET_SIZE(item) < 2
            || PyBytes_AS_STRING(item)[0] != '"') {
            PyErr_SetString(PyExc_ValueError,
                            "literals are bytes of two or more that start with `\"`");
            return -1;
        }
        lits->text[k] = PyBytes_AS_STRING(item);
        lits->size[k] = PyBytes_GET_SIZE(item);
        lits->second[(unsigned char)lits->text[k][1]] |= (uint32_t)1 << k;
    }
    for (int byte = 0; byte < 256; byte++)
        if (lits->second[byte] && lits->letters++ < 8)
            lits->letter[lits->letters - 1] = (unsigned char)byte;
    return 0;
}

/* Called with each occurrence (literal k at p); nonzero stops the scan. */
typedef int (*on_literal)(void *context, Py_ssize_t k, Py_ssize_t p);

static inline int
match_at(const unsigned char *data, Py_ssize_t size, const Literals *lits, Py_ssize_t p,
         on_literal found, void *context)
{
    uint32_t which = lits->second[data[p + 1]];
    for (Py_ssize_t k = 0; which; k++, which >>= 1)
        if ((which & 1) && size - p >= lits->size[k]
            && memcmp(data + p, lits->text[k], lits->size[k]) == 0 && found(context, k, p))
            return -1;
    return 0;
}

/* Every occurrence of the literals that starts in [from, to), in order (an occurrence
   may run on past `to`, up to the data's `size`). */
static int
scan_literals(const unsigned char *data, Py_ssize_t size, Py_ssize_t from, Py_ssize_t to,
              const Literals *lits, on_literal found, void *context)
{
    Py_ssize_t i = from, last = to < size - 1 ? to : size - 1; /* a `"` needs a next byte */
#ifdef __SSE2__
    /* 16 positions at a time: a `"` whose next byte is some literal's second byte (up
       to eight such bytes, the first repeated to make four or eight, for a loop of fixed
       length: the seven keys an anchor's duplicate check counts begin with five) */
    if (lits->letters >= 1 && lits->letters <= 8) {
        __m128i letter[8];
        int wide = lits->letters > 4;
        for (int j = 0; j < 8; j++)
            letter[j] = _mm_set1_epi8((char)lits->letter[j < lits->letters ? j : 0]);
        const __m128i quote = _mm_set1_epi8('"');
        for (; i + 16 <= last; i += 16) {
            __m128i at = _mm_loadu_si128((const __m128i *)(data + i));
            __m128i next = _mm_loadu_si128((const __m128i *)(data + i + 1));
            __m128i any = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(next, letter[0]), _mm_cmpeq_epi8(next, letter[1])),
                _mm_or_si128(_mm_cmpeq_epi8(next, letter[2]), _mm_cmpeq_epi8(next, letter[3])));
            if (wide)
                any = _mm_or_si128(any, _mm_or_si128(
                    _mm_or_si128(_mm_cmpeq_epi8(next, letter[4]),
                                 _mm_cmpeq_epi8(next, letter[5])),
                    _mm_or_si128(_mm_cmpeq_epi8(next, letter[6]),
                                 _mm_cmpeq_epi8(next, letter[7]))));
            unsigned mask = (unsigned)_mm_movemask_epi8(
                _mm_and_si128(_mm_cmpeq_epi8(at, quote), any));
            for (; mask; mask &= mask - 1)
                if (match_at(data, size, lits, i + __builtin_ctz(mask), found, context))
                    return -1;
        }
    }
#endif
    for (; i < last; i++)
        if (data[i] == '"' && match_at(data, size, lits, i, found, context))
            return -1;
    return 0;
}

typedef struct {
    Py_ssize_t events, event;
    int64_t *first; /* [literal][event] */
    int32_t *count;
} PerEvent;

static int
count_in_event(void *context, Py_ssize_t k, Py_ssize_t p)
{
    PerEvent *per = context;
    Py_ssize_t at = k * per->events + per->event;
    if (per->count[at]++ == 0)
        per->first[at] = p;
    return 0;
}

PyDoc_STRVAR(event_keys_doc,
"event_keys(data, starts, ends, literals) -> (first, count)\n\n"
"Per literal and per event [starts[i], ends[i]): where its first occurrence starts\n"
"(-1 without one) and how many start in the event, as int64 and int32\n"
"bytearrays laid out [literal][event] (keyscan.EventKeys).");

static PyObject *
event_keys(PyObject *module, PyObject *args)
{
    Py_buffer buf, starts, ends;
    PyObject *starts_obj, *ends_obj, *tuple, *first = NULL, *count = NULL;
    Literals lits;
    if (!PyArg_ParseTuple(args, "y*OOO!:event_keys", &buf, &starts_obj, &ends_obj,
                          &PyTuple_Type, &tuple))
        return NULL;
    if (column(starts_obj, &starts, -1, "starts") < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_ssize_t n = starts.len / 8;
    if (column(ends_obj, &ends, n, "ends") < 0) {
        PyBuffer_Release(&starts);
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (literals_from(tuple, &lits) < 0)
        goto done;
    first = PyByteArray_FromStringAndSize(NULL, lits.count * n * 8);
    count = PyByteArray_FromStringAndSize(NULL, lits.count * n * 4);
    if (first == NULL || count == NULL)
        goto done;
    PerEvent per = {n, 0, (int64_t *)PyByteArray_AS_STRING(first),
                    (int32_t *)PyByteArray_AS_STRING(count)};
    memset(per.first, 0xff, lits.count * n * 8); /* -1 */
    memset(per.count, 0, lits.count * n * 4);
    const int64_t *s = starts.buf, *e = ends.buf;
    for (; per.event < n; per.event++) {
        int64_t from = s[per.event], to = e[per.event];
        if (from < 0 || to > buf.len || from > to) {
            PyErr_Format(PyExc_ValueError, "event %zd lies outside the data", per.event);
            goto done;
        }
        scan_literals(buf.buf, buf.len, from, to, &lits, count_in_event, &per);
    }
done:
    PyBuffer_Release(&ends);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&buf);
    if (PyErr_Occurred()) {
        Py_XDECREF(first);
        Py_XDECREF(count);
        return NULL;
    }
    return Py_BuildValue("(NN)", first, count);
}

enum { PREVIOUS, PID_START, PID_END, TID_START, TID_END, RESUME, ORDINAL, COLUMNS };
static const char *column_names[COLUMNS] = {
    "previous", "pid_start", "pid_end", "tid_start", "tid_end", "resume", "ordinal"};

/* A member template: four bytes objects around the pid, tid and ordinal. */
typedef struct {
    const char *part[4];
    Py_ssize_t len[4], fixed;
} Template;

static int
template(PyObject *parts, Template *t)
{
    if (!PyTuple_Check(parts) || PyTuple_GET_SIZE(parts) != 4) {
        PyErr_SetString(PyExc_TypeError, "a member template is four bytes objects");
        return -1;
    }
    t->fixed = 0;
    for (int k = 0; k < 4; k++) {
        PyObject *item = PyTuple_GET_ITEM(parts, k);
        if (!PyBytes_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "a member template is four bytes objects");
            return -1;
        }
        t->part[k] = PyBytes_AS_STRING(item);
        t->len[k] = PyBytes_GET_SIZE(item);
        t->fixed += t->len[k];
    }
    return 0;
}

/* Whether the args object whose members start at `inside` has any (the provenance
   member then takes a `, ` after it). */
static inline int
args_have_members(const char *data, Py_ssize_t size, int64_t inside)
{
    const unsigned char *q = skip_space((const unsigned char *)data + inside,
                                        (const unsigned char *)data + size);
    return q == (const unsigned char *)data + size || *q != '}';
}

PyDoc_STRVAR(splice_doc,
"splice(data, columns, with_args, new_tids, new_pids, with_args_member, no_args_member)\n"
"-> bytes\n\n"
"The chunk with n events spliced in place (rewrite._splice_in_place). `columns`\n"
"holds seven int64 arrays of length n: previous, pid_start, pid_end, tid_start,\n"
"tid_end, resume (where the original bytes go on: inside the args' brace, or\n"
"at the event's `}`) and ordinal. Per event: data[previous:tid_start] (with\n"
"data[pid_start:pid_end] replaced by new_pids[i] unless that is None), new_tids[i],\n"
"data[tid_end:resume], and the member: template[0] + pid + template[1] + tid +\n"
"template[2] + ordinal + template[3], from with_args_member where with_args[i]\n"
"(followed by `, ` unless the args are empty) and from no_args_member elsewhere.\n"
"data[resume[-1]:] ends the chunk.\n\n"
"With `into` (a writable buffer: a worker's shared slot), a chunk that fits is\n"
"written there and its length returned instead (workers.deliver without a copy).");


/* `value` in decimal, as "%lld" writes it, into `out` (24 bytes hold any int64); the
   length. snprintf parsed its format for every relocated event: ~1.5% of a compact run. */
static int
decimal_text(char *out, int64_t value)
{
    char reversed[20];
    uint64_t magnitude = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    int count = 0, len = 0;
    do {
        reversed[count++] = (char)('0' + magnitude % 10);
        magnitude /= 10;
    } while (magnitude);
    if (value < 0)
        out[len++] = '-';
    while (count)
        out[len++] = reversed[--count];
    return len;
}

static PyObject *
splice(PyObject *module, PyObject *args)
{
    Py_buffer buf, flags, into = {0};
    PyObject *columns_obj, *new_tids, *new_pids, *with_parts, *without_parts;
    if (!PyArg_ParseTuple(args, "y*O!y*O!O!OO|w*:splice", &buf, &PyTuple_Type, &columns_obj,
                          &flags, &PyList_Type, &new_tids, &PyList_Type, &new_pids,
                          &with_parts, &without_parts, &into))
        return NULL;
    Py_buffer col[COLUMNS];
    int held = 0;
    PyObject *out = NULL;
    Py_ssize_t n = PyList_GET_SIZE(new_tids);
    const char *data = buf.buf;
    const unsigned char *with_args = flags.buf;
    const int64_t *c[COLUMNS];
    Template with, without;

    if (PyTuple_GET_SIZE(columns_obj) != COLUMNS || n == 0 || flags.len != n
        || PyList_GET_SIZE(new_pids) != n) {
        PyErr_SetString(PyExc_ValueError, "splice takes seven columns, flags, tids and pids "
                                          "for the same one event or more");
        goto done;
    }
    if (template(with_parts, &with) < 0 || template(without_parts, &without) < 0)
        goto done;
    for (; held < COLUMNS; held++) {
        if (column(PyTuple_GET_ITEM(columns_obj, held), &col[held], n, column_names[held]) < 0)
            goto done;
        c[held] = col[held].buf;
    }

    /* The ranges must follow each other in the data; sum the output's size. */
    int64_t last = 0;
    Py_ssize_t total = buf.len;
    char digits[24];
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t prev = c[PREVIOUS][i], p0 = c[PID_START][i], p1 = c[PID_END][i];
        int64_t t0 = c[TID_START][i], t1 = c[TID_END][i], resume = c[RESUME][i];
        PyObject *tid = PyList_GET_ITEM(new_tids, i), *pid = PyList_GET_ITEM(new_pids, i);
        if (prev != last || !(prev <= p0 && p0 <= p1 && p1 <= t0 && t0 <= t1 && t1 <= resume
                              && resume < buf.len)) {
            PyErr_Format(PyExc_ValueError, "event %zd's ranges are out of order", i);
            goto done;
        }
        if (!PyBytes_Check(tid) || (pid != Py_None && !PyBytes_Check(pid))) {
            PyErr_SetString(PyExc_TypeError, "new tids are bytes, new pids bytes or None");
            goto done;
        }
        const Template *t = with_args[i] ? &with : &without;
        total += PyBytes_GET_SIZE(tid) - (t1 - t0) + t->fixed + (p1 - p0) + (t1 - t0)
                 + decimal_text(digits, c[ORDINAL][i]);
        if (pid != Py_None)
            total += PyBytes_GET_SIZE(pid) - (p1 - p0);
        if (with_args[i] && args_have_members(data, buf.len, resume))
            total += 2; /* the `, ` before the args' own members */
        last = resume;
    }

    char *start;
    if (into.obj != NULL && total <= into.len) {
        start = into.buf;
    }
    else {
        out = PyBytes_FromStringAndSize(NULL, total);
        if (out == NULL)
            goto done;
        start = PyBytes_AS_STRING(out);
    }
    char *w = start;
#define PUT(src, len) do { memcpy(w, (src), (len)); w += (len); } while (0)
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t prev = c[PREVIOUS][i], p0 = c[PID_START][i], p1 = c[PID_END][i];
        int64_t t0 = c[TID_START][i], t1 = c[TID_END][i], resume = c[RESUME][i];
        PyObject *tid = PyList_GET_ITEM(new_tids, i), *pid = PyList_GET_ITEM(new_pids, i);
        if (pid == Py_None) {
            PUT(data + prev, t0 - prev);
        }
        else {
            PUT(data + prev, p0 - prev);
            PUT(PyBytes_AS_STRING(pid), PyBytes_GET_SIZE(pid));
            PUT(data + p1, t0 - p1);
        }
        PUT(PyBytes_AS_STRING(tid), PyBytes_GET_SIZE(tid));
        PUT(data + t1, resume - t1);
        const Template *t = with_args[i] ? &with : &without;
        int len = decimal_text(digits, c[ORDINAL][i]);
        PUT(t->part[0], t->len[0]);
        PUT(data + p0, p1 - p0);
        PUT(t->part[1], t->len[1]);
        PUT(data + t0, t1 - t0);
        PUT(t->part[2], t->len[2]);
        PUT(digits, len);
        PUT(t->part[3], t->len[3]);
        if (with_args[i] && args_have_members(data, buf.len, resume))
            PUT(", ", 2);
    }
    PUT(data + last, buf.len - last);
#undef PUT
    if (w != start + total) { /* cannot happen: the sizes were summed above */
        Py_CLEAR(out);
        PyErr_SetString(PyExc_SystemError, "splice: size mismatch");
    }
    else if (out == NULL) {
        out = PyLong_FromSsize_t(total);
    }

done:
    for (int k = 0; k < held; k++)
        PyBuffer_Release(&col[k]);
    PyBuffer_Release(&flags);
    PyBuffer_Release(&buf);
    if (into.obj != NULL)
        PyBuffer_Release(&into);
    return out;
}

PyDoc_STRVAR(integer_ends_doc,
"integer_ends(data, begin) -> int64 bytearray\n\n"
"Per position of the int64 array `begin`: the end of the integer literal that starts\n"
"there when a comma follows it directly, else -1 (keyscan.KeyScan.integer_ends).");

#define MAX_INTEGER_DIGITS 19

static PyObject *
integer_ends(PyObject *module, PyObject *args)
{
    Py_buffer buf, begin;
    PyObject *begin_obj;
    if (!PyArg_ParseTuple(args, "y*O:integer_ends", &buf, &begin_obj))
        return NULL;
    if (column(begin_obj, &begin, -1, "begin") < 0) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_ssize_t count = begin.len / 8;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, count * 8);
    if (out != NULL) {
        const unsigned char *data = buf.buf;
        const int64_t *at = begin.buf;
        int64_t *end = (int64_t *)PyByteArray_AS_STRING(out);
        Py_ssize_t size = buf.len;
        for (Py_ssize_t i = 0; i < count; i++) {
            int64_t p = at[i];
            end[i] = -1;
            if (p < 0 || p >= size)
                continue;
            if (data[p] == '-')
                p++;
            int64_t first = p;
            while (p < size && p - first <= MAX_INTEGER_DIGITS && data[p] >= '0' && data[p] <= '9')
                p++;
            if (p > first && p < size && data[p] == ',')
                end[i] = p;
        }
    }
    PyBuffer_Release(&begin);
    PyBuffer_Release(&buf);
    return out;
}

/* Where `type` keeps the field `name` of its instances (a msgspec Struct's fields are
   slots), or -1 when it is not a plain object slot. The field may be inherited (observe's
   Event extends ReadEvent), so the types of the MRO are searched in order, as attribute
   lookup does: a slot of a base keeps its offset in the subclass. */
static Py_ssize_t
slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *descr = NULL;
    PyObject *mro = type->tp_mro;
    Py_ssize_t bases = mro != NULL ? PyTuple_GET_SIZE(mro) : 0;
    for (Py_ssize_t i = 0; i < bases && descr == NULL; i++) {
        PyObject *dict = ((PyTypeObject *)PyTuple_GET_ITEM(mro, i))->tp_dict;
        descr = dict != NULL ? PyDict_GetItemString(dict, name) : NULL;
    }
    if (descr == NULL || !Py_IS_TYPE(descr, &PyMemberDescr_Type))
        return -1;
    PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
    return member->type == T_OBJECT_EX ? member->offset : -1;
}

/* The field at `offset` of an object of the expected type (a borrowed reference). */
static inline PyObject *
field_at(PyObject *object, Py_ssize_t offset)
{
    return *(PyObject **)((char *)object + offset);
}

/* A field of objects that are mostly of one type: read from its slot in objects of
   the first type seen, with getattr in any other. */
typedef struct {
    const char *name;
    PyTypeObject *type;
    Py_ssize_t offset;
    int column; /* in a scan: 0 not looked up yet, -1 none, else F_* + 1 (field_column) */
} Field;

/* The field's value (a new reference), or NULL with an exception. */
static PyObject *
read_field(PyObject *object, Field *field)
{
    if (field->type == NULL) {
        field->type = Py_TYPE(object);
        field->offset = slot_offset(field->type, field->name);
    }
    PyObject *value = Py_TYPE(object) == field->type && field->offset >= 0
                          ? Py_XNewRef(field_at(object, field->offset))
                          : PyObject_GetAttrString(object, field->name);
    if (value == NULL && !PyErr_Occurred())
        PyErr_Format(PyExc_AttributeError, "an event's `%s` is unset", field->name);
    return value;
}

/* -- the scan: a chunk's events read in one pass, without a Python object each ---------

   msgspec decodes every event of a chunk into a struct of objects (its phase, category,
   name, pid and tid as new str and int objects, its ts and dur as Raw views, its args as
   another struct), and the index pass then reads a few of those fields of each event
   and frees them all: more than half of the decode's time. `scan_events` validates the
   same JSON in one pass and keeps, per event, where each field's value lies and what
   kind of value it is. A value becomes an object only when a function below reads it,
   and then one object per distinct text of the chunk (a chunk has a few categories,
   pids and names among thousands of events).

   It accepts only what msgspec accepts with the same result, and declines (None) the
   rest: a key spelled with escapes, a field given twice, a pid that is no integer of up
   to 18 digits, string or null, a field msgspec decodes as any value (the category, the
   name, args.device, ...) holding a float, a longer integer, an array or an object (msgspec
   refuses numbers out of range there), nesting deeper than MAX_SCAN_DEPTH, a surrogate
   escape.
   The caller then decodes the chunk with msgspec, which says what is wrong, if anything.

   In verify's mode (`origins`) the provenance is read as verify's own struct (_Origin: an
   object or null, anything else declined) and its pid and tid are fields of their own,
   held to the same rules; the index pass's mode takes it as any value (an object:
   declined).

   The scan is a sequence of its events: `scan[i]` is event i decoded by msgspec (for the
   few events Python code reads one by one). The functions below that read events take
   a list of msgspec structs or a scan (see Events). */

enum { F_PH, F_CAT, F_NAME, F_PID, F_TID, F_TS, F_DUR, F_ARGS, F_ID, F_BP,
       F_DEVICE, F_STREAM, F_PROVENANCE, F_ORIGIN_PID, F_ORIGIN_TID, SCAN_FIELDS };
static const char *const scan_field_names[SCAN_FIELDS] = {
    "ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id", "bp",
    "device", "stream", "provenance", "origin pid", "origin tid"};
enum { V_ABSENT, V_STRING, V_ESCAPED, V_INT, V_NUMBER, V_NULL, V_TRUE, V_FALSE,
       V_OBJECT, V_ARRAY };
#define MAX_SCAN_DEPTH 64

#define MAX_SPAN ((1 << 28) - 1) /* a longer value: the scan declines */

typedef struct {
    int32_t off;       /* the value's text, in the scanned document */
    uint32_t len : 28;
    uint32_t type : 4; /* V_* */
} Span;

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

/* Whether a span is an integer of at most 18 digits (within int64 whatever they are). */
static inline int
short_int(const unsigned char *d, const Span *span)
{
    return span->type == V_INT && span->len - (d[span->off] == '-') <= 18;
}

/* Whether a field's value is of a kind its msgspec type takes as the scan reads it
   (`origins`: the provenance is verify's struct of pid and tid, see scan_events). */
static inline int
scan_type_ok(const unsigned char *d, int field, const Span *span, int origins)
{
    if (field == F_PROVENANCE && origins) /* _Origin | None */
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

static PyTypeObject ScannedType = {
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

/* The value of a short integer's text (short_int). */
static inline int64_t
short_int_value(const unsigned char *text, Py_ssize_t len)
{
    int64_t number = 0;
    for (Py_ssize_t j = text[0] == '-'; j < len; j++)
        number = 10 * number + (text[j] - '0');
    return text[0] == '-' ? -number : number;
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
static PyObject *
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

PyDoc_STRVAR(scan_events_doc,
"scan_events(document, decode_value, decode_event, unset, bracketed, origins=False)\n"
"-> Scan or None\n\n"
"A chunk's events (bytes-like: a JSON array where `bracketed`, else the events and\n"
"the commas between them), validated and read in one pass, or\n"
"None where the scan declines (see the comment above scan_events in the source):\n"
"its `ascii` is False where a string holds a byte above 0x7F: the caller then checks\n"
"the chunk is UTF-8 before it reads a value (the scan does not).\n"
"decode it with msgspec then. The scan is a sequence of the events; functions of\n"
"this module that read events' fields take it as they take a list of msgspec structs\n"
"(observe.Event). `decode_value(text)` gives a field's value where the scan keeps\n"
"none of its own (escaped strings, floats, objects), `decode_event(text)` an event,\n"
"`unset` the provenance of args without one.\n"
"`origins`: read the provenance as verify's struct (verify._Origin: an object or null,\n"
"its pid and tid kept as fields of their own, any value msgspec takes there) instead of\n"
"as any value (an object: declined).");

static PyObject *
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

/* The events a function reads: a list of msgspec structs, or a scan. */
typedef struct {
    PyObject *list;
    Scanned *scan;
    Py_ssize_t size;
} Events;

/* PyArg_ParseTuple's "O&" converter for Events. */
static int
events_arg(PyObject *object, void *address)
{
    Events *events = address;
    if (PyList_Check(object)) {
        *events = (Events){object, NULL, PyList_GET_SIZE(object)};
        return 1;
    }
    if (Py_IS_TYPE(object, &ScannedType)) {
        *events = (Events){NULL, (Scanned *)object, ((Scanned *)object)->n};
        return 1;
    }
    PyErr_SetString(PyExc_ValueError, "events: a list of structs or a scan");
    return 0;
}

/* The scan's column of a field (F_*), found by its name once, or -1. */
static int
field_column(Field *field)
{
    if (field->column == 0) {
        field->column = -1;
        for (int k = 0; k < SCAN_FIELDS; k++)
            if (strcmp(scan_field_names[k], field->name) == 0)
                field->column = k + 1;
    }
    return field->column > 0 ? field->column - 1 : -1;
}

/* events[i].<field> (a new reference), or NULL with an exception. */
static PyObject *
event_field(Events *events, Py_ssize_t i, Field *field)
{
    if (events->list != NULL)
        return read_field(PyList_GET_ITEM(events->list, i), field);
    int column = field_column(field);
    if (column < 0 || column == F_ARGS || column >= F_DEVICE) {
        PyErr_Format(PyExc_AttributeError, "a scanned event has no field `%s`", field->name);
        return NULL;
    }
    return scanned_value(events->scan, i, column);
}

/* events[i].args.<inner>, or `no_args` where args is None (a new reference), or NULL with
   an exception. */
static PyObject *
event_args_field(Events *events, Py_ssize_t i, Field *args_field, Field *inner,
                 PyObject *no_args)
{
    if (events->list != NULL) {
        PyObject *event_args = read_field(PyList_GET_ITEM(events->list, i), args_field);
        if (event_args == NULL || event_args == Py_None) {
            Py_XDECREF(event_args);
            return event_args == NULL ? NULL : Py_NewRef(no_args);
        }
        PyObject *value = read_field(event_args, inner);
        Py_DECREF(event_args);
        return value;
    }
    int column = field_column(inner);
    if (field_column(args_field) != F_ARGS || column < F_DEVICE
        || column >= events->scan->fields) {
        PyErr_Format(PyExc_AttributeError, "a scanned event has no field `%s.%s`",
                     args_field->name, inner->name);
        return NULL;
    }
    if (events->scan->col[F_ARGS][i].type != V_OBJECT)
        return Py_NewRef(no_args);
    return scanned_value(events->scan, i, column);
}

/* For a scan: whether field `column` of event i is the one-letter string `letter` (1 or
   0), or -1 where the value must be decoded to know (escapes); -1 for a list too. */
static int
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
static Py_ssize_t
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

PyDoc_STRVAR(event_values_doc,
"event_values(events, indices, key) -> list\n\n"
"events[i].<key> for each of the indices (a list of msgspec structs or a scan, whose\n"
"ts and dur are bytes where msgspec gives a Raw): a scan reads these where they lie,\n"
"its events one by one are decoded whole.");

static PyObject *
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

PyDoc_STRVAR(decimal_column_doc,
"decimal_column(events, key, signed) -> (ns, shapes)\n\n"
"The events' `key` field (msgspec.Raw number texts, empty where absent) as a ts or\n"
"dur column, each value by its own shape: 0 absent, 1 an integer, 2 a number with\n"
"one to three decimals (exact in ns: Kineto's shapes and floats such as 68.0; below\n"
"9e15 us, not negative unless `signed`),\n"
"3 anything else (read one by one by the caller). Gives the values in ns (int64\n"
"bytearray, 0 where absent or of shape 3) and the shapes (a bytearray), so one odd\n"
"value costs its own event, not its chunk (observe.kineto_shapes and observe._ints).");

#define MAX_WHOLE_DIGITS 16 /* integer digits of a value below 9e15 us */
#define MAX_FAST_DECIMALS 3 /* decimals of a value exact in ns (observe.MAX_FAST_DECIMALS) */
enum { SHAPE_ABSENT, SHAPE_INTEGER, SHAPE_DECIMAL, SHAPE_OTHER };

static PyObject *
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
   with the next number when new (verify._Interned); -1 with an exception (an
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
   (verify._TrackCodes); -1 with an exception. */
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
   provenance (verify._Origin) and that one's pid and tid. */
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

PyDoc_STRVAR(check_columns_doc,
"check_columns(events, kinds, activity, (pid numbers, pid values),\n"
"              (tid numbers, tid values), (device numbers, device values))\n"
"-> (phases, kinds, tracks, origins, moved, devices)\n\n"
"What verify's output-only checks read of a chunk's decoded events (a list of\n"
"verify._CheckEvent, or their scan_events with `origins`), per event: the phase (int8: 1\n"
"for X, 2 for s, t and f, else 0); the kind (int8:\n"
"kinds[cat] for X, else 0); the track (int64: the pid's number << 32 | the tid's); the\n"
"original track (the provenance's pid and tid, for a moved flow or a moved X event of\n"
"an `activity` kind (bytes: 1 at such a kind), else the track); whether it is moved\n"
"(args and its provenance present, bool); the number of args.device for an X event of\n"
"an activity kind (None without args), else -1 (int64). Values are numbered as\n"
"verify._Interned numbers them (the dicts and lists are its own, extended in place):\n"
"every event's pid and tid, then the provenances', then the devices, in event order.\n"
"A TypeError for an unhashable category, provenance pid or tid, or device.");

static PyObject *
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

PyDoc_STRVAR(continues_doc,
"continues(data, positions, literal) -> bytearray\n\n"
"Per position of the int64 array: 1 where `literal` starts there, else 0\n"
"(keyscan.KeyScan.continues).");

static PyObject *
continues(PyObject *module, PyObject *args)
{
    Py_buffer buf, at, literal;
    PyObject *at_obj;
    if (!PyArg_ParseTuple(args, "y*Oy*:continues", &buf, &at_obj, &literal))
        return NULL;
    PyObject *out = NULL;
    if (column(at_obj, &at, -1, "positions") == 0) {
        Py_ssize_t count = at.len / 8;
        out = PyByteArray_FromStringAndSize(NULL, count);
        if (out != NULL) {
            const int64_t *p = at.buf;
            char *ok = PyByteArray_AS_STRING(out);
            for (Py_ssize_t i = 0; i < count; i++)
                ok[i] = p[i] >= 0 && p[i] <= buf.len - literal.len
                        && memcmp((const char *)buf.buf + p[i], literal.buf, literal.len) == 0;
        }
        PyBuffer_Release(&at);
    }
    PyBuffer_Release(&literal);
    PyBuffer_Release(&buf);
    return out;
}

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

PyDoc_STRVAR(slice_keys_doc,
"slice_keys(events, indices, scopes, scopes_device)\n"
"-> (track codes, track keys, group codes, group keys)\n\n"
"For the events at `indices`: each one's (pid, tid) and (pid, device) as a code\n"
"(int32 bytearray) into the distinct keys, listed in order of first appearance.\n"
"The device is args.device (None without args), or `scopes_device` where the\n"
"byte of `scopes` is set. A TypeError for an unhashable device (observe._intern).");

static PyObject *
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

#define MAX_PHASES 32

PyDoc_STRVAR(classify_doc,
"classify(events, phase_codes, other_phase, kinds)\n"
"-> (phases, kinds, owned, phase counts)\n\n"
"Per event (msgspec structs, with `ph`, `cat`, `pid` and `tid` fields): the code\n"
"phase_codes.get(ph, other_phase) and kinds[cat], as int8 bytearrays, whether\n"
"it has both a pid and a tid (not None, as a bool bytearray), and how often each ph\n"
"occurs, in order of first appearance (observe._Observer.run).\n"
"A TypeError for an unhashable category or more than 32 distinct phases.");

static PyObject *
classify(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *phase_codes, *kinds;
    int other_phase;
    if (!PyArg_ParseTuple(args, "O&O!iO!:classify", events_arg, &events, &PyDict_Type,
                          &phase_codes, &other_phase, &PyDict_Type, &kinds))
        return NULL;
    Py_ssize_t n = events.size;
    PyObject *phases = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *kind_codes = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *owners = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *counts = PyDict_New(), *ph = NULL, *cat = NULL;
    PyObject *seen[MAX_PHASES]; /* the distinct phases, in order of first appearance */
    Py_ssize_t seen_count[MAX_PHASES];
    int distinct = 0;
    if (phases == NULL || kind_codes == NULL || owners == NULL || counts == NULL)
        goto fail;
    Field ph_field = {"ph", NULL, -1}, cat_field = {"cat", NULL, -1};
    Field pid_field = {"pid", NULL, -1}, tid_field = {"tid", NULL, -1};
    char *phase = PyByteArray_AS_STRING(phases), *kind = PyByteArray_AS_STRING(kind_codes);
    char *owned = PyByteArray_AS_STRING(owners);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XSETREF(ph, event_field(&events, i, &ph_field));
        Py_XSETREF(cat, ph ? event_field(&events, i, &cat_field) : NULL);
        if (cat == NULL)
            goto fail;
        if (events.scan != NULL) { /* a pid and a tid: neither absent nor null */
            int pid = events.scan->col[F_PID][i].type, tid = events.scan->col[F_TID][i].type;
            owned[i] = pid != V_ABSENT && pid != V_NULL && tid != V_ABSENT && tid != V_NULL;
        } else {
            PyObject *pid = event_field(&events, i, &pid_field);
            PyObject *tid = pid ? event_field(&events, i, &tid_field) : NULL;
            owned[i] = tid != NULL && pid != Py_None && tid != Py_None;
            Py_XDECREF(pid);
            if (tid == NULL)
                goto fail;
            Py_DECREF(tid);
        }
        PyObject *code = PyDict_GetItemWithError(phase_codes, ph);
        if (code == NULL && PyErr_Occurred())
            goto fail;
        phase[i] = (char)(code ? PyLong_AsLong(code) : other_phase);
        /* count ph among the few distinct ones seen (by identity first) */
        int j = 0;
        while (j < distinct && seen[j] != ph)
            j++;
        for (int k = 0; j == distinct && k < distinct; k++) {
            int equal = PyObject_RichCompareBool(seen[k], ph, Py_EQ);
            if (equal < 0)
                goto fail;
            if (equal)
                j = k;
        }
        if (j == distinct) {
            if (distinct == MAX_PHASES) {
                PyErr_SetString(PyExc_TypeError, "too many distinct phases");
                goto fail;
            }
            seen[distinct] = Py_NewRef(ph);
            seen_count[distinct++] = 0;
        }
        seen_count[j]++;
        PyObject *found = PyDict_GetItemWithError(kinds, cat);
        if (found != NULL) {
            kind[i] = (char)PyLong_AsLong(found);
            continue;
        }
        if (PyErr_Occurred())
            goto fail;
        found = PyObject_GetItem(kinds, cat); /* the dict's __missing__ classifies it */
        if (found == NULL)
            goto fail;
        kind[i] = (char)PyLong_AsLong(found);
        Py_DECREF(found);
    }
    for (int j = 0; j < distinct; j++) {
        PyObject *count = PyLong_FromSsize_t(seen_count[j]);
        if (count == NULL || PyDict_SetItem(counts, seen[j], count) < 0) {
            Py_XDECREF(count);
            goto fail;
        }
        Py_DECREF(count);
    }
    Py_XDECREF(ph);
    Py_XDECREF(cat);
    for (int j = 0; j < distinct; j++)
        Py_DECREF(seen[j]);
    return Py_BuildValue("(NNNN)", phases, kind_codes, owners, counts);

fail:
    Py_XDECREF(ph);
    Py_XDECREF(cat);
    for (int j = 0; j < distinct; j++)
        Py_DECREF(seen[j]);
    Py_XDECREF(phases);
    Py_XDECREF(kind_codes);
    Py_XDECREF(owners);
    Py_XDECREF(counts);
    return NULL;
}

PyDoc_STRVAR(first_set_doc,
"first_set(events, outer, inner, unset) -> int or None\n\n"
"The index of the first event whose `outer` field is not None and whose\n"
"outer.inner is not `unset` (observe._Observer._provenance).");

static PyObject *
first_set(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *unset;
    Field outer_field = {NULL, NULL, -1}, inner_field = {NULL, NULL, -1};
    if (!PyArg_ParseTuple(args, "O&ssO:first_set", events_arg, &events, &outer_field.name,
                          &inner_field.name, &unset))
        return NULL;
    for (Py_ssize_t i = 0; i < events.size; i++) {
        PyObject *inner = event_args_field(&events, i, &outer_field, &inner_field, unset);
        if (inner == NULL)
            return NULL;
        int set = inner != unset;
        Py_DECREF(inner);
        if (set)
            return PyLong_FromSsize_t(i);
    }
    Py_RETURN_NONE;
}

/* list[at] for an index read from another list, or NULL with an IndexError. */
static PyObject *
item_at(PyObject *list, PyObject *index)
{
    Py_ssize_t at = PyLong_AsSsize_t(index);
    if (at < 0 || at >= PyList_GET_SIZE(list)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_IndexError, "an index past the list");
        return NULL;
    }
    return PyList_GET_ITEM(list, at);
}

/* The `name` of events[slices[k]] (a new reference), or NULL with an exception. */
static PyObject *
kernel_name(Events *events, PyObject *slices, PyObject *k, Field *name_field)
{
    PyObject *slice = item_at(slices, k);
    Py_ssize_t at = slice ? event_index(events, slice) : -1;
    return at >= 0 ? event_field(events, at, name_field) : NULL;
}

PyDoc_STRVAR(name_counts_doc,
"name_counts(events, slices, kernels, groups) -> {group: {name: count}}\n\n"
"For each k in `kernels`, the event events[slices[k]] counted by its `name`\n"
"under groups[k]: groups and names in order of first appearance, equal names\n"
"counted as one key, as Counter counts them (observe._Observer._kernel_names).\n"
"A TypeError for an unhashable name.");

/* Names counted in a small buffer before they reach a group's dict: most kernels of a
   chunk share a dozen names, and adding 1 in the dict for each (hashing every decoded
   name once, a new int each time) cost more than finding the name among the few seen.
   Names in order of first appearance; only exact str (equal iff same length, kind and
   code units), so a dict's notion of equality (1 == 1.0 == True) never comes up. */
#define TALLY_NAMES 32

typedef struct {
    Py_ssize_t used;
    PyObject *name[TALLY_NAMES]; /* strong references */
    Py_ssize_t count[TALLY_NAMES];
} Tally;

static int
same_str(PyObject *a, PyObject *b)
{
    Py_ssize_t length = PyUnicode_GET_LENGTH(a);
    return a == b || (PyUnicode_GET_LENGTH(b) == length && PyUnicode_KIND(a) == PyUnicode_KIND(b)
                      && memcmp(PyUnicode_DATA(a), PyUnicode_DATA(b),
                                length * PyUnicode_KIND(a)) == 0);
}

/* Add `n` to `name`'s count in `counts`; -1 with an exception. */
static int
count_name(PyObject *counts, PyObject *name, Py_ssize_t n)
{
    PyObject *count = PyDict_GetItemWithError(counts, name);
    if (count == NULL && PyErr_Occurred())
        return -1;
    PyObject *more = PyLong_FromSsize_t((count != NULL ? PyLong_AsSsize_t(count) : 0) + n);
    int stored = more != NULL ? PyDict_SetItem(counts, name, more) : -1;
    Py_XDECREF(more);
    return stored;
}

/* Move the buffered counts into `counts` (when given), in the order the names came, and
   empty the buffer; -1 on error. */
static int
flush_tally(Tally *tally, PyObject *counts)
{
    int result = 0;
    for (Py_ssize_t j = 0; j < tally->used; j++) {
        if (result == 0 && counts != NULL && count_name(counts, tally->name[j], tally->count[j]) < 0)
            result = -1;
        Py_DECREF(tally->name[j]);
    }
    tally->used = 0;
    return result;
}

static PyObject *
name_counts(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *slices, *kernels, *groups;
    if (!PyArg_ParseTuple(args, "O&O!O!O!:name_counts", events_arg, &events, &PyList_Type,
                          &slices, &PyList_Type, &kernels, &PyList_Type, &groups))
        return NULL;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    Field name_field = {"name", NULL, -1};
    PyObject *group = NULL, *counts = NULL; /* borrowed: the last group and its counts */
    Tally tally = {0};
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kernels); i++) {
        PyObject *k = PyList_GET_ITEM(kernels, i);
        PyObject *its_group = item_at(groups, k);
        if (its_group == NULL)
            goto fail;
        if (its_group != group) {
            if (flush_tally(&tally, counts) < 0)
                goto fail;
            group = its_group;
            counts = PyDict_GetItemWithError(out, group);
            if (counts == NULL) {
                if (PyErr_Occurred() || (counts = PyDict_New()) == NULL)
                    goto fail;
                int stored = PyDict_SetItem(out, group, counts);
                Py_DECREF(counts); /* `out` holds it */
                if (stored < 0)
                    goto fail;
            }
        }
        PyObject *name = kernel_name(&events, slices, k, &name_field);
        if (name == NULL)
            goto fail;
        if (!PyUnicode_CheckExact(name)) { /* counted in the dict, after the names before */
            int counted = flush_tally(&tally, counts) == 0 ? count_name(counts, name, 1) : -1;
            Py_DECREF(name);
            if (counted < 0)
                goto fail;
            continue;
        }
        Py_ssize_t j = 0;
        while (j < tally.used && !same_str(tally.name[j], name))
            j++;
        if (j < tally.used) {
            Py_DECREF(name);
        } else {
            if (j == TALLY_NAMES) {
                if (flush_tally(&tally, counts) < 0) {
                    Py_DECREF(name);
                    goto fail;
                }
                j = 0;
            }
            tally.name[j] = name; /* the buffer's reference now */
            tally.count[j] = 0;
            tally.used = j + 1;
        }
        tally.count[j]++;
    }
    if (flush_tally(&tally, counts) < 0)
        goto fail;
    return out;

fail:
    flush_tally(&tally, NULL);
    Py_DECREF(out);
    return NULL;
}

PyDoc_STRVAR(first_unhashable_device_doc,
"first_unhashable_device(events, slices, scopes) -> int or None\n\n"
"The first position k whose event events[slices[k]] has an args.device that\n"
"cannot be a key (a list or dict), skipping positions where the byte of\n"
"`scopes` is set; None when every one can (observe._Observer._anchor_kernels).");

static PyObject *
first_unhashable_device(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *slices;
    Py_buffer scopes;
    if (!PyArg_ParseTuple(args, "O&O!y*:first_unhashable_device", events_arg, &events,
                          &PyList_Type, &slices, &scopes))
        return NULL;
    PyObject *out = NULL;
    Field args_field = {"args", NULL, -1}, device_field = {"device", NULL, -1};
    Py_ssize_t n = PyList_GET_SIZE(slices);
    if (scopes.len != n) {
        PyErr_SetString(PyExc_ValueError, "one scopes flag per slice");
        goto done;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        if (((const char *)scopes.buf)[k])
            continue;
        Py_ssize_t at = event_index(&events, PyList_GET_ITEM(slices, k));
        PyObject *device = at >= 0 ? event_args_field(&events, at, &args_field, &device_field,
                                                      Py_None)
                                   : NULL;
        if (device == NULL)
            goto done;
        Py_hash_t hash = PyObject_Hash(device);
        Py_DECREF(device);
        if (hash == -1) {
            if (!PyErr_ExceptionMatches(PyExc_TypeError))
                goto done;
            PyErr_Clear();
            out = PyLong_FromSsize_t(k);
            goto done;
        }
    }
    out = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&scopes);
    return out;
}

PyDoc_STRVAR(named_doc,
"named(events, slices, kernels, wanted) -> list\n\n"
"The k in `kernels` (in order) whose event events[slices[k]] has a `name` in\n"
"`wanted` (a dict); a TypeError for an unhashable name\n"
"(observe._Observer._anchor_kernels).");

static PyObject *
named(PyObject *module, PyObject *args)
{
    Events events;
    PyObject *slices, *kernels, *wanted;
    if (!PyArg_ParseTuple(args, "O&O!O!O!:named", events_arg, &events, &PyList_Type,
                          &slices, &PyList_Type, &kernels, &PyDict_Type, &wanted))
        return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    Field name_field = {"name", NULL, -1};
    Tally seen = {0};  /* names looked up, count: whether `wanted` holds each */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(kernels); i++) {
        PyObject *k = PyList_GET_ITEM(kernels, i);
        PyObject *name = kernel_name(&events, slices, k, &name_field);
        int found = -1;
        if (name != NULL && PyUnicode_CheckExact(name)) {
            /* a name seen before in this call is found by comparing it, not by hashing it
               (Kineto's kernel names are templated C++, often hundreds of characters) */
            Py_ssize_t j = 0;
            while (j < seen.used && !same_str(seen.name[j], name))
                j++;
            if (j < seen.used) {
                found = (int)seen.count[j];
            } else {
                found = PyDict_Contains(wanted, name);
                if (found >= 0 && seen.used < TALLY_NAMES) {
                    seen.name[seen.used] = Py_NewRef(name);
                    seen.count[seen.used++] = found;
                }
            }
        } else if (name != NULL) {
            found = PyDict_Contains(wanted, name);
        }
        Py_XDECREF(name);
        if (found < 0 || (found && PyList_Append(out, k) < 0)) {
            flush_tally(&seen, NULL);
            Py_DECREF(out);
            return NULL;
        }
    }
    flush_tally(&seen, NULL);
    return out;
}

PyDoc_STRVAR(match_keys_doc,
"match_keys(events, indices) -> (stream codes, stream keys, name codes, name keys)\n\n"
"For the events at `indices` (matched kernels): each one's args.stream (None\n"
"without args) and `name` as a code (int32 bytearray) into the distinct keys\n"
"(type(value), value), listed in order of first appearance, so 1, 1.0 and true\n"
"stay three (observe._Observer._match_keys). A TypeError for an unhashable stream\n"
"or name.");

static PyObject *
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

PyDoc_STRVAR(track_keys_doc,
"track_keys(events, indices) -> (track codes, track keys)\n\n"
"For the events at `indices`: each one's (pid, tid) as a code (int32 bytearray)\n"
"into the distinct keys, listed in order of first appearance (slice_keys without\n"
"the groups; observe._Observer._first_on_track).");

static PyObject *
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

PyDoc_STRVAR(flow_columns_doc,
"flow_columns(events, flows, no_id)\n"
"-> (track codes, track keys, binds next, ids, categories)\n\n"
"For the flow events at `flows`: each one's (pid, tid) as a code (int32 bytearray)\n"
"into the distinct keys, listed in order of first appearance; whether it binds to\n"
"the next slice (ph \"f\" and bp not \"e\", a bool bytearray: observe.binds_next);\n"
"its id where that is an int strictly between -2**62 and 2**62, else `no_id`\n"
"(int64 bytearray); and how often each category occurs (str(cat) for one that is\n"
"no string), in order of first appearance (observe._Observer._flows).");

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

static PyObject *
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

/* -- the anchors report's JSON rows (inspect.MatchRows.json_text) ----------------------- */

enum { TEXTS, INTEGERS, FIXED, SHORTEST, CODED, COLUMN_KINDS };

/* One column of rows: given texts, or int64 values written as one of the number forms. */
typedef struct {
    int kind;
    Py_buffer values;  /* INTEGERS, FIXED, SHORTEST: the numbers; CODED: the codes */
    int held;
    const int64_t *v;
    PyObject *texts;   /* TEXTS: one bytes per row; CODED: one bytes per code */
    int scale;         /* FIXED, SHORTEST: decimals */
} RowColumn;

/* The decimal digits of `a` at `out`; returns how many (at most 20). */
static int
digits(char *out, uint64_t a)
{
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + a % 10);
        a /= 10;
    } while (a);
    for (int k = 0; k < n; k++)
        out[k] = tmp[n - 1 - k];
    return n;
}

static const uint64_t powers_of_ten[] = {
    1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL, 10000000ULL,
    100000000ULL, 1000000000ULL, 10000000000ULL, 100000000000ULL, 1000000000000ULL,
    10000000000000ULL, 100000000000000ULL, 1000000000000000ULL};

#define SHORTEST_LIMIT 1000000000000000ULL /* 10**15: at most 15 significant digits */

/* `value` written in a column's form at `out` (room for 48 bytes); returns the length,
   or -1 where SHORTEST cannot say what orjson would write (the caller declines). */
static int
number_text(char *out, int kind, int scale, int64_t value)
{
    int n = 0;
    if (kind == SHORTEST && value == INT64_MIN) {
        memcpy(out, "null", 4);
        return 4;
    }
    uint64_t a = value < 0 ? (uint64_t)0 - (uint64_t)value : (uint64_t)value;
    if (kind == INTEGERS) {
        if (value < 0)
            out[n++] = '-';
        return n + digits(out + n, a);
    }
    if (kind == SHORTEST) {
        /* orjson writes a double in its shortest round-trip form: for the double nearest
           to value / 10**scale (which round(value / 10**scale, scale) is, see
           MatchRows.json_text) that is the decimal itself while it has at most 15
           significant digits, in fixed notation from 1e-5 up (below, orjson writes 1e-6) */
        if (a >= SHORTEST_LIMIT || (a != 0 && scale >= 5 && a < powers_of_ten[scale - 5]))
            return -1;
    }
    uint64_t unit = powers_of_ten[scale];
    uint64_t whole = a / unit, part = a % unit;
    if (value < 0)
        out[n++] = '-';
    n += digits(out + n, whole);
    out[n++] = '.';
    int width = scale;
    if (kind == SHORTEST) {
        while (width > 1 && part % 10 == 0) {  /* trailing zeros go; one digit stays */
            part /= 10;
            width--;
        }
        if (width == 0)  /* scale 0 */
            width = 1;
    }
    for (int k = width - 1; k >= 0; k--) {
        out[n + k] = (char)('0' + part % 10);
        part /= 10;
    }
    return n + width;
}

static void
row_columns_release(RowColumn *cols, Py_ssize_t count)
{
    for (Py_ssize_t c = 0; c < count; c++)
        if (cols[c].held)
            PyBuffer_Release(&cols[c].values);
}

/* Column c of the spec `(kind, ...)` for n rows. */
static int
row_column(PyObject *spec, Py_ssize_t n, RowColumn *col)
{
    memset(col, 0, sizeof *col);
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 2)
        goto bad;
    col->kind = (int)PyLong_AsLong(PyTuple_GET_ITEM(spec, 0));
    if (col->kind == -1 && PyErr_Occurred())
        return -1;
    PyObject *second = PyTuple_GET_ITEM(spec, 1);
    if (col->kind == TEXTS) {
        if (!PyList_Check(second) || PyList_GET_SIZE(second) != n)
            goto bad;
        col->texts = second;
        return 0;
    }
    if (col->kind <= TEXTS || col->kind >= COLUMN_KINDS)
        goto bad;
    Py_ssize_t wanted = col->kind == INTEGERS ? 2 : 3;
    if (PyTuple_GET_SIZE(spec) != wanted)
        goto bad;
    if (column(second, &col->values, n, "a row column") < 0)
        return -1;
    col->held = 1;
    col->v = col->values.buf;
    if (col->kind == CODED) {
        col->texts = PyTuple_GET_ITEM(spec, 2);
        if (!PyList_Check(col->texts))
            goto bad;
        return 0;
    }
    if (col->kind == FIXED || col->kind == SHORTEST) {
        long scale = PyLong_AsLong(PyTuple_GET_ITEM(spec, 2));
        if (scale == -1 && PyErr_Occurred())
            return -1;
        if (scale < 0 || scale > 9 || (col->kind == FIXED && scale == 0))
            goto bad;
        col->scale = (int)scale;
    }
    return 0;
bad:
    PyErr_SetString(PyExc_TypeError, "a row column is (TEXTS, list), (INTEGERS, int64s), "
                    "(FIXED or SHORTEST, int64s, decimals) or (CODED, int64s, list)");
    return -1;
}

/* The bytes object `item`'s size (a TypeError for anything else, -1). */
static Py_ssize_t
row_text_size(PyObject *item)
{
    if (!PyBytes_Check(item)) {
        PyErr_SetString(PyExc_TypeError, "row texts must be bytes");
        return -1;
    }
    return PyBytes_GET_SIZE(item);
}

/* Row i's text of a TEXTS or CODED column (an IndexError for a code that names none). */
static PyObject *
row_text(const RowColumn *col, Py_ssize_t i)
{
    if (col->kind == TEXTS)
        return PyList_GET_ITEM(col->texts, i);
    int64_t code = col->v[i];
    if (code < 0 || code >= PyList_GET_SIZE(col->texts)) {
        PyErr_SetString(PyExc_IndexError, "a row code names no text");
        return NULL;
    }
    return PyList_GET_ITEM(col->texts, code);
}

#define NUMBER_ROOM 48  /* what number_text may write */

/* An upper bound of json_rows' output: its parts, separators and texts as they are,
   NUMBER_ROOM bytes a number; -1 with the error of an odd text. */
static Py_ssize_t
rows_bound(Py_ssize_t n, PyObject *parts, const RowColumn *cols, Py_ssize_t count,
           Py_ssize_t sep_len)
{
    if (n <= 0)
        return 0;
    Py_ssize_t row = sep_len;
    for (Py_ssize_t k = 0; k <= count; k++)
        row += PyBytes_GET_SIZE(PyTuple_GET_ITEM(parts, k));
    for (Py_ssize_t c = 0; c < count; c++)
        if (cols[c].kind != TEXTS && cols[c].kind != CODED)
            row += NUMBER_ROOM;
    if (n && row > PY_SSIZE_T_MAX / n)
        goto too_big;
    Py_ssize_t bound = n * row;
    for (Py_ssize_t c = 0; c < count; c++) {
        if (cols[c].kind != TEXTS && cols[c].kind != CODED)
            continue;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = row_text(&cols[c], i);
            Py_ssize_t size = item == NULL ? -1 : row_text_size(item);
            if (size < 0)
                return -1;
            if (bound > PY_SSIZE_T_MAX - size)
                goto too_big;
            bound += size;
        }
    }
    return bound;
too_big:
    PyErr_NoMemory();
    return -1;
}

PyDoc_STRVAR(json_rows_doc,
"json_rows(n, parts, columns, separator) -> bytes or None\n\n"
"n rows joined by `separator`, row i being parts[0] + column 0's text of row i +\n"
"parts[1] + ... + parts[-1] (one more part than columns). A column is\n"
"(TEXTS, list of n bytes), (INTEGERS, int64s), (FIXED, int64s, d): v / 10**d with\n"
"exactly d decimals (matches.threes for d = 3), (SHORTEST, int64s, d): what\n"
"orjson writes for round(v / 10**d, d), `null` for INT64_MIN, or (CODED, int64s,\n"
"texts): texts[code]. None where a SHORTEST value has more than 15 significant\n"
"digits or lies below 1e-5 (orjson's scientific notation): the caller writes\n"
"those rows itself (inspect.MatchRows.json_text).");

static PyObject *
json_rows(PyObject *module, PyObject *args)
{
    Py_ssize_t n;
    PyObject *parts, *specs;
    Py_buffer sep;
    if (!PyArg_ParseTuple(args, "nO!O!y*:json_rows", &n, &PyTuple_Type, &parts,
                          &PyTuple_Type, &specs, &sep))
        return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(specs);
    RowColumn *cols = PyMem_Calloc(count ? count : 1, sizeof(RowColumn));
    PyObject *out = NULL;
    if (cols == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (PyTuple_GET_SIZE(parts) != count + 1) {
        PyErr_SetString(PyExc_TypeError, "json_rows takes one more part than columns");
        goto done;
    }
    for (Py_ssize_t k = 0; k <= count; k++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(parts, k))) {
            PyErr_SetString(PyExc_TypeError, "row parts must be bytes");
            goto done;
        }
    for (Py_ssize_t c = 0; c < count; c++)  /* cols is zeroed: each one read is released */
        if (row_column(PyTuple_GET_ITEM(specs, c), n, &cols[c]) < 0)
            goto done;
    /* written straight into the bytes object, sized by an upper bound and cut to what
       was written: no growing buffer copied into it at the end */
    Py_ssize_t bound = rows_bound(n, parts, cols, count, sep.len);
    if (bound < 0)
        goto done;
    out = PyBytes_FromStringAndSize(NULL, bound);
    if (out == NULL)
        goto done;
    char *start = PyBytes_AS_STRING(out), *at = start;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i) {
            memcpy(at, sep.buf, sep.len);
            at += sep.len;
        }
        for (Py_ssize_t c = 0; c <= count; c++) {
            PyObject *part = PyTuple_GET_ITEM(parts, c);
            memcpy(at, PyBytes_AS_STRING(part), PyBytes_GET_SIZE(part));
            at += PyBytes_GET_SIZE(part);
            if (c == count)
                break;
            RowColumn *col = &cols[c];
            if (col->kind == TEXTS || col->kind == CODED) {
                PyObject *item = row_text(col, i);  /* checked by rows_bound */
                memcpy(at, PyBytes_AS_STRING(item), PyBytes_GET_SIZE(item));
                at += PyBytes_GET_SIZE(item);
                continue;
            }
            int len = number_text(at, col->kind, col->scale, col->v[i]);
            if (len < 0) {
                Py_SETREF(out, Py_NewRef(Py_None));
                goto done;
            }
            at += len;
        }
    }
    _PyBytes_Resize(&out, at - start);  /* NULL with the error when it fails */
done:
    if (cols != NULL)
        row_columns_release(cols, count);
    PyMem_Free(cols);
    PyBuffer_Release(&sep);
    return out;
}

/* ---- restore's quick undo (edit.undo_relocations) ---- */


/* Whether data[at:] starts with the literal. */
static inline int
starts_with(const unsigned char *d, Py_ssize_t size, Py_ssize_t at, const char *literal,
            Py_ssize_t len)
{
    return at >= 0 && at + len <= size && memcmp(d + at, literal, len) == 0;
}
#define LEN(lit) ((Py_ssize_t)sizeof(lit) - 1)
#define STARTS(at, lit) starts_with(d, size, (at), (lit), LEN(lit))

static inline Py_ssize_t
space_back(const unsigned char *d, Py_ssize_t i)
{
    while (i > 0 && is_json_space(d[i - 1]))
        i--;
    return i;
}

/* `"[^"\\]*"` ending at e (exclusive): its start, or -1. */
static inline Py_ssize_t
string_back(const unsigned char *d, Py_ssize_t e)
{
    if (e < 2 || d[e - 1] != '"')
        return -1;
    for (Py_ssize_t q = e - 2; q >= 0; q--) {
        if (d[q] == '"')
            return q;
        if (d[q] == '\\')
            return -1;
    }
    return -1;
}

/* A pid or tid value ending at e (`-?[0-9]+` or `"[^"\\]*"`): its start, or -1. */
static inline Py_ssize_t
scalar_back(const unsigned char *d, Py_ssize_t e)
{
    if (e > 0 && d[e - 1] == '"')
        return string_back(d, e);
    Py_ssize_t q = e;
    while (q > 0 && d[q - 1] >= '0' && d[q - 1] <= '9')
        q--;
    if (q == e)
        return -1;
    return q > 0 && d[q - 1] == '-' ? q - 1 : q;
}

/* The same value starting at p: its end, or -1. */
static inline Py_ssize_t
scalar_forward(const unsigned char *d, Py_ssize_t size, Py_ssize_t p)
{
    if (p < size && d[p] == '"') {
        for (Py_ssize_t q = p + 1; q < size; q++) {
            if (d[q] == '"')
                return q + 1;
            if (d[q] == '\\')
                return -1;
        }
        return -1;
    }
    if (p < size && d[p] == '-')
        p++;
    Py_ssize_t q = p;
    while (q < size && d[q] >= '0' && d[q] <= '9')
        q++;
    return q > p ? q : -1;
}

/* `ws* : ws* "key"` ending at e, read backwards: where its `"key"` starts, or -1. */
static inline Py_ssize_t
colon_key_back(const unsigned char *d, Py_ssize_t e, const char *key, Py_ssize_t len)
{
    Py_ssize_t i = space_back(d, e);
    if (i < 1 || d[i - 1] != ':')
        return -1;
    i = space_back(d, i - 1) - len - 2;
    if (i < 0 || d[i] != '"' || d[i + len + 1] != '"' || memcmp(d + i + 1, key, len) != 0)
        return -1;
    return i;
}

/* Kineto's simple members between the lane tid and `args`, read backwards from e:
   (`ws* , ws* "key" ws* : ws* value`)* ws*, keys ts, dur, cat, name, bp, s, id, values
   `[0-9.eE+-]+` or `"[^"\\]*"`. Where the lane tid's value ends. */
static Py_ssize_t
simple_members_back(const unsigned char *d, Py_ssize_t e)
{
    static const char *keys[] = {"ts", "dur", "cat", "name", "bp", "s", "id"};
    Py_ssize_t i = space_back(d, e);
    for (;;) {
        Py_ssize_t v = i;
        if (v > 0 && d[v - 1] == '"')
            v = string_back(d, v);
        else
            while (v > 0 && ((d[v - 1] >= '0' && d[v - 1] <= '9') || d[v - 1] == '.'
                             || d[v - 1] == 'e' || d[v - 1] == 'E' || d[v - 1] == '+'
                             || d[v - 1] == '-'))
                v--;
        if (v < 0 || v == i)
            return i;
        Py_ssize_t k = -1;
        for (size_t n = 0; n < sizeof keys / sizeof *keys && k < 0; n++)
            k = colon_key_back(d, v, keys[n], (Py_ssize_t)strlen(keys[n]));
        if (k < 0)
            return i;
        k = space_back(d, k);
        if (k < 1 || d[k - 1] != ',')
            return i;
        i = space_back(d, k - 1);
    }
}

/* One relocated event's edit, found from its provenance member at `key` (the offset of
   PROVENANCE_KEY in it). Returns 0 and fills the spans, or -1 where the member or the
   event is not as the rewrite writes it. */
typedef struct {
    Py_ssize_t head;                  /* the event's `"pid"` key */
    Py_ssize_t pid0, pid1, tid0, tid1; /* the lane's pid and tid values */
    Py_ssize_t orig_pid0, orig_pid1, orig_tid0, orig_tid1; /* in the member */
    Py_ssize_t cut0, cut1;            /* what goes: the member (and what came with it) */
} Undone;

static int
locate_undo(const unsigned char *d, Py_ssize_t size, Py_ssize_t key, Undone *u)
{
    Py_ssize_t member = key - 1, p = key + PROVENANCE_KEY_LEN;
    if (member < 0 || d[member] != '"' || !STARTS(p, "\": {\"pid\": "))
        return -1;
    u->orig_pid0 = p + LEN("\": {\"pid\": ");
    if ((u->orig_pid1 = scalar_forward(d, size, u->orig_pid0)) < 0
        || !STARTS(u->orig_pid1, ", \"tid\": "))
        return -1;
    u->orig_tid0 = u->orig_pid1 + LEN(", \"tid\": ");
    if ((u->orig_tid1 = scalar_forward(d, size, u->orig_tid0)) < 0
        || !STARTS(u->orig_tid1, ", \"source_event_index\": "))
        return -1;
    p = u->orig_tid1 + LEN(", \"source_event_index\": ");
    Py_ssize_t digits = p;
    while (p < size && d[p] >= '0' && d[p] <= '9')
        p++;
    if (p == digits)
        return -1;
    Py_ssize_t between_end;
    if (STARTS(p, ", \"had_args\": true}")) {
        /* it had args: the member goes, with the `, ` after it */
        u->cut0 = member;
        u->cut1 = p + LEN(", \"had_args\": true}");
        u->cut1 += STARTS(u->cut1, ", ") ? LEN(", ") : 0;
        Py_ssize_t i = member;
        if (i < 1 || d[i - 1] != '{')
            return -1;
        if ((i = colon_key_back(d, i - 1, "args", 4)) < 0)
            return -1;
        i = space_back(d, i);
        if (i < 1 || d[i - 1] != ',')
            return -1;
        between_end = i - 1;
    }
    else if (STARTS(p, ", \"had_args\": false}}")) {
        /* it had none: `, "args": {member}` goes */
        if (!STARTS(member - LEN(", \"args\": {"), ", \"args\": {"))
            return -1;
        u->cut0 = between_end = member - LEN(", \"args\": {");
        u->cut1 = p + LEN(", \"had_args\": false}}");
    }
    else
        return -1;
    u->tid1 = simple_members_back(d, between_end);
    if ((u->tid0 = scalar_back(d, u->tid1)) < 0)
        return -1;
    Py_ssize_t i = colon_key_back(d, u->tid0, "tid", 3);
    if (i < 0)
        return -1;
    i = space_back(d, i);
    if (i < 1 || d[i - 1] != ',')
        return -1;
    u->pid1 = space_back(d, i - 1);
    if ((u->pid0 = scalar_back(d, u->pid1)) < 0)
        return -1;
    return (u->head = colon_key_back(d, u->pid0, "pid", 3)) < 0 ? -1 : 0;
}
#undef STARTS
#undef LEN

PyDoc_STRVAR(undo_relocations_doc,
"undo_relocations(data) -> (bytes, count) or None\n\n"
"edit.undo_relocations: every relocated event of the chunk back on its original pid\n"
"and tid, its provenance member gone, and how many; None where a provenance key is\n"
"left (an event not as the rewrite writes it). Quick, not exact (see edit.py): only\n"
"for a result whose sha256 is then compared with the source's.");

static PyObject *
undo_relocations(PyObject *module, PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "undo_relocations takes bytes");
        return NULL;
    }
    const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t size = PyBytes_GET_SIZE(arg);
    const unsigned char *found = memmem(d, size, PROVENANCE_KEY, PROVENANCE_KEY_LEN);
    if (found == NULL)
        return Py_BuildValue("(Oi)", arg, 0);
    /* every edit makes the event shorter: the member holds the original values */
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t copied = 0, count = 0;
    Undone u;
#define PUT(from, to) do { memcpy(w, d + (from), (to) - (from)); w += (to) - (from); } while (0)
    while (found != NULL) {
        if (locate_undo(d, size, found - d, &u) < 0 || u.head < copied) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        PUT(copied, u.pid0);
        PUT(u.orig_pid0, u.orig_pid1);
        PUT(u.pid1, u.tid0);
        PUT(u.orig_tid0, u.orig_tid1);
        PUT(u.tid1, u.cut0);
        copied = u.cut1;
        count++;
        found = memmem(d + copied, size - copied, PROVENANCE_KEY, PROVENANCE_KEY_LEN);
    }
    PUT(copied, size);
#undef PUT
    Py_ssize_t len = w - (unsigned char *)PyBytes_AS_STRING(out);
    if (memmem(PyBytes_AS_STRING(out), len, PROVENANCE_KEY, PROVENANCE_KEY_LEN) != NULL) {
        Py_DECREF(out);  /* the key made again where pieces meet: as the reference does */
        Py_RETURN_NONE;
    }
    if (_PyBytes_Resize(&out, len) < 0)
        return NULL;
    return Py_BuildValue("(Nn)", out, count);
}

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
