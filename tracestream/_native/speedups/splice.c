/* The rewrite's splice of relocated events (splice: write.rewrite; twin reference.splice) and
   restore's quick undo of it (undo_relocations; twin reference.splice). */

#include "speedups.h"

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

SHARED_DOC(splice_doc,
"splice(data, columns, with_args, new_tids, new_pids, with_args_member, no_args_member,\n"
"groups=None) -> bytes\n\n"
"The chunk with n events spliced in place (reference.splice.splice). `columns`\n"
"holds seven int64 arrays of length n: previous, pid_start, pid_end, tid_start,\n"
"tid_end, resume (where the original bytes go on: inside the args' brace, or\n"
"at the event's `}`) and ordinal. Per event: data[previous:tid_start] (with\n"
"data[pid_start:pid_end] replaced by new_pids[i] unless that is None), new_tids[i],\n"
"data[tid_end:resume], and the member: template[0] + pid + template[1] + tid +\n"
"template[2] + ordinal + groups[i] + template[3], from with_args_member where\n"
"with_args[i] (followed by `, ` unless the args are empty) and from no_args_member\n"
"elsewhere; `groups` (per event bytes or None: the lane group's member) is None\n"
"where no event has one. data[resume[-1]:] ends the chunk.\n\n"
"With `into` (a writable buffer: a worker's shared slot), a chunk that fits is\n"
"written there and its length returned instead (parallel.slots.deliver without a copy).");


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

PyObject *
splice(PyObject *module, PyObject *args)
{
    Py_buffer buf, flags, into = {0};
    PyObject *columns_obj, *new_tids, *new_pids, *with_parts, *without_parts;
    PyObject *groups = Py_None;
    if (!PyArg_ParseTuple(args, "y*O!y*O!O!OO|Ow*:splice", &buf, &PyTuple_Type, &columns_obj,
                          &flags, &PyList_Type, &new_tids, &PyList_Type, &new_pids,
                          &with_parts, &without_parts, &groups, &into))
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
    if (groups != Py_None && (!PyList_Check(groups) || PyList_GET_SIZE(groups) != n)) {
        PyErr_SetString(PyExc_TypeError, "groups is None or a list, one per event");
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
        PyObject *group = groups == Py_None ? Py_None : PyList_GET_ITEM(groups, i);
        if (group != Py_None && !PyBytes_Check(group)) {
            PyErr_SetString(PyExc_TypeError, "groups are bytes or None");
            goto done;
        }
        const Template *t = with_args[i] ? &with : &without;
        total += PyBytes_GET_SIZE(tid) - (t1 - t0) + t->fixed + (p1 - p0) + (t1 - t0)
                 + decimal_text(digits, c[ORDINAL][i]);
        if (group != Py_None)
            total += PyBytes_GET_SIZE(group);
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
        PyObject *group = groups == Py_None ? Py_None : PyList_GET_ITEM(groups, i);
        if (group != Py_None)
            PUT(PyBytes_AS_STRING(group), PyBytes_GET_SIZE(group));
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

/* ---- restore's quick undo (reference.splice.undo_relocations) ---- */


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
    if (STARTS(p, ", \"group\": \"")) { /* the lane group (--lane-groups): goes with it */
        Py_ssize_t q = p + LEN(", \"group\": \"");
        while (q < size && d[q] != '"' && d[q] != '\\')
            q++;
        if (q >= size || d[q] != '"')
            return -1;
        p = q + 1;
    }
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

SHARED_DOC(undo_relocations_doc,
"undo_relocations(data) -> (bytes, count) or None\n\n"
"reference.splice.undo_relocations: every relocated event of the chunk back on its original pid\n"
"and tid, its provenance member gone, and how many; None where a provenance key is\n"
"left (an event not as the rewrite writes it). Quick, not exact (see reference/splice.py): only\n"
"for a result whose sha256 is then compared with the source's.");

PyObject *
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
