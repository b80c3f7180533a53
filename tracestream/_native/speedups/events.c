/* The events a function reads, a list of msgspec structs or a scan (Events, see
   speedups.h), and their fields: read from the structs' slots (Field, read_field), or
   where the scan found them (scanned_value, scan.c). */

#include "speedups.h"

/* Where `type` keeps the field `name` of its instances (a msgspec Struct's fields are
   slots), or -1 when it is not a plain object slot. The field may be inherited (model's
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

/* The field's value (a new reference), or NULL with an exception. */
PyObject *
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

/* PyArg_ParseTuple's "O&" converter for Events. */
int
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
int
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
PyObject *
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
PyObject *
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
