/* The anchors report's JSON rows (evidence.rows, plan.guidetext): json_rows (twin: reference.rows). */

#include "speedups.h"

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

SHARED_DOC(json_rows_doc,
"json_rows(n, parts, columns, separator) -> bytes or None\n\n"
"n rows joined by `separator`, row i being parts[0] + column 0's text of row i +\n"
"parts[1] + ... + parts[-1] (one more part than columns). A column is\n"
"(TEXTS, list of n bytes), (INTEGERS, int64s), (FIXED, int64s, d): v / 10**d with\n"
"exactly d decimals (index.matches.threes for d = 3), (SHORTEST, int64s, d): what\n"
"orjson writes for round(v / 10**d, d), `null` for INT64_MIN, or (CODED, int64s,\n"
"texts): texts[code]. None where a SHORTEST value has more than 15 significant\n"
"digits or lies below 1e-5 (orjson's scientific notation): the caller writes\n"
"those rows itself (evidence.rows.MatchRows.json_text).");

PyObject *
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
