/* Byte scans of a chunk (index/keyscan.py; twins in reference/keys.py): separators, event_keys, continues and
   integer_ends. And `column`, the int64 buffer argument the functions of keyscan.c,
   splice.c and rows.c take. */

#include "speedups.h"

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

SHARED_DOC(separators_doc,
"separators(data) -> (closes, opens)\n\n"
"Every `}` ws* `,` ws* `{` in data: the offset of its `}` and the offset after\n"
"its `{`, as int64 bytearrays (reference.keys.separators).");

PyObject *
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

/* An int64 column given as a buffer, of `count` items (any number when count < 0), always
   8-byte aligned: numpy calls a one-row field of a packed record array (the index's span
   rows) contiguous however its address falls, and an int64 load from an odd address is
   undefined behaviour; such a column is read from an aligned copy, which `view` owns. */
int
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
    if ((uintptr_t)view->buf % _Alignof(int64_t) == 0)
        return 0;
    /* A bytearray's storage comes from the allocator, aligned for any type. */
    PyObject *copy = PyByteArray_FromStringAndSize(view->buf, view->len);
    PyBuffer_Release(view);
    if (copy == NULL)
        return -1;
    int got = PyObject_GetBuffer(copy, view, PyBUF_SIMPLE);
    Py_DECREF(copy); /* the view holds its own reference until it is released */
    return got;
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

SHARED_DOC(event_keys_doc,
"event_keys(data, starts, ends, literals) -> (first, count)\n\n"
"Per literal and per event [starts[i], ends[i]): where its first occurrence starts\n"
"(-1 without one) and how many start in the event, as int64 and int32\n"
"bytearrays laid out [literal][event] (reference.keys.event_keys).");

PyObject *
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

SHARED_DOC(integer_ends_doc,
"integer_ends(data, begin) -> int64 bytearray\n\n"
"Per position of the int64 array `begin`: the end of the integer literal that starts\n"
"there when a comma follows it directly, else -1 (reference.keys.integer_ends).");

#define MAX_INTEGER_DIGITS 19

PyObject *
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

SHARED_DOC(continues_doc,
"continues(data, positions, literal) -> bytearray\n\n"
"Per position of the int64 array: 1 where `literal` starts there, else 0\n"
"(reference.keys.continues).");

PyObject *
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
