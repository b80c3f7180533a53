/* Events classified, and kernels picked and counted by name: classify, first_set,
   name_counts, first_unhashable_device and named. */

#include "speedups.h"

#define MAX_PHASES 32

SHARED_DOC(classify_doc,
"classify(events, phase_codes, other_phase, kinds)\n"
"-> (phases, kinds, owned, phase counts)\n\n"
"Per event (msgspec structs, with `ph`, `cat`, `pid` and `tid` fields): the code\n"
"phase_codes.get(ph, other_phase) and kinds[cat], as int8 bytearrays, whether\n"
"it has both a pid and a tid (not None, as a bool bytearray), and how often each ph\n"
"occurs, in order of first appearance (its twin: reference.events.classify).\n"
"A TypeError for an unhashable category or more than 32 distinct phases.");

PyObject *
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

SHARED_DOC(first_set_doc,
"first_set(events, outer, inner, unset) -> int or None\n\n"
"The index of the first event whose `outer` field is not None and whose\n"
"outer.inner is not `unset` (reference.events.first_set).");

PyObject *
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

SHARED_DOC(name_counts_doc,
"name_counts(events, slices, kernels, groups) -> {group: {name: count}}\n\n"
"For each k in `kernels`, the event events[slices[k]] counted by its `name`\n"
"under groups[k]: groups and names in order of first appearance, equal names\n"
"counted as one key, as Counter counts them (reference.events.name_counts).\n"
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

PyObject *
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

SHARED_DOC(first_unhashable_device_doc,
"first_unhashable_device(events, slices, scopes) -> int or None\n\n"
"The first position k whose event events[slices[k]] has an args.device that\n"
"cannot be a key (a list or dict), skipping positions where the byte of\n"
"`scopes` is set; None when every one can (reference.events.first_unhashable_device).");

PyObject *
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

SHARED_DOC(named_doc,
"named(events, slices, kernels, wanted) -> list\n\n"
"The k in `kernels` (in order) whose event events[slices[k]] has a `name` in\n"
"`wanted` (a dict); a TypeError for an unhashable name\n"
"(reference.events.named).");

PyObject *
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
