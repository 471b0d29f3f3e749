/* Protobuf wire bytes -> Arrow buffers, table-driven: the native value decoder.
 *
 * Python (native.py) compiles a descriptor into a plan: the output columns (one per Arrow array of the
 * table's struct type), the messages (one plan per message *position* in the column tree, plus one per
 * message *type* for parts that are validated but not written), and the enums. `Plan.decode` walks the
 * values of one Arrow batch once, writing every field straight into its column's buffers; `Batch.export`
 * hands those buffers to pyarrow through the Arrow C data interface. No Python object is made per row or
 * per field, except for the rare cases listed in native.py (failures, Kind.CUT fields).
 *
 * It must agree exactly with upb (what parses, what is an unknown field) and with the Python reference
 * decoder (the values). Where exactness would need protobuf's merge semantics on already-written
 * columns (a singular message field that occurs twice, a oneof switching away from a message member, a
 * proto2 string holding invalid UTF-8), the row is "escaped": its columns are rolled back and Python
 * decodes it with the reference decoder.
 *
 * Columns live in "groups": all columns that share one index space (the struct columns reached from one
 * list item, or from the root, and their non-list descendants). Opening a slot in a group makes a slot
 * in every column of the group; buffers are zeroed when they grow, and zero is every column's default
 * (0, "", false, empty list, NULL), so an absent field costs nothing. Variable-length columns keep each
 * slot's length (prefix-summed into offsets at export); a slot's bytes are always the tail of its
 * column's data while the message holding it is decoded, which makes last-one-wins overwrites cheap.
 *
 * No global mutable state: a Plan is immutable after construction, a Batch belongs to one decode call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- constants shared with native.py */

enum { VT_INT32 = 1, VT_INT64, VT_UINT32, VT_UINT64, VT_SINT32, VT_SINT64, VT_BOOL, VT_ENUM, VT_FIXED32,
       VT_SFIXED32, VT_FLOAT, VT_FIXED64, VT_SFIXED64, VT_DOUBLE, VT_STRING, VT_BYTES, VT_MESSAGE };
enum { K_SCALAR = 1, K_RECORD, K_TIMESTAMP, K_DURATION, K_DATE, K_WRAPPER, K_STRUCT, K_VALUE, K_LIST, K_CUT,
       K_MSG };
enum { S_SINGULAR = 1, S_REPEATED, S_MAP };
enum { F_UTF8 = 1, F_CLOSED = 2, F_REQUIRED = 4, F_AUX_UTF8 = 8 };
/* C_U64TXT: a uint64/fixed64 in a STRING column, kept as the number and written as its decimal text at
 * export, so that an absent value (a zeroed slot) reads "0" as in the reference, not "". */
enum { C_STRUCT = 1, C_LIST, C_BOOL, C_I32, C_I64, C_F64, C_DEC, C_VAR, C_ENUM, C_CUT, C_U64TXT };
enum { FAIL_DESERIALIZATION = 1, FAIL_INVALID = 2 };
enum { CUT_MESSAGE = 0, CUT_ENTRY = 1 };

/* upb's default nesting limit (kUpb_WireFormat_DefaultDepthLimit): the root message is level 0. */
#define MAX_LEVEL 100
#define MAX_SEEN_WORDS 16 /* tracked fields (singular messages, required) per message: 1024 */
#define MAX_ONEOFS 64
#define DENSE_LIMIT 1024 /* field numbers below this are found by a table lookup */

#define OK 0
#define E_PARSE (-1)
#define E_ESCAPE (-2)
#define E_NOMEM (-3)
#define E_OVERFLOW (-4)

/* Timestamp: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z; Duration: +-10,000 years (protobuf's own). */
#define TS_MIN_SECONDS (-62135596800LL)
#define TS_MAX_SECONDS 253402300799LL
#define DURATION_MAX_SECONDS 315576000000LL
#define NANOS_MAX 999999999

/* ---------------------------------------------------------------- Arrow C data interface */

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

/* ---------------------------------------------------------------- the plan */

typedef struct {
    uint32_t number;
    uint8_t vt, kind, shape, flags;
    uint8_t wt;     /* wire type of one value */
    uint8_t aux_vt; /* a wrapper's value type */
    uint8_t packable;
    int16_t oneof;
    int32_t seen; /* bit in the message's seen set, or -1 */
    int32_t col;  /* output column, or -1 (type plans) */
    int32_t sub;  /* K_RECORD: child position plan; map: entry plan; other messages: type plan */
    int32_t tsub; /* type plan of the field's message type (validation of discarded values) */
    int32_t enum_id;
    char *name;
} Field;

typedef struct {
    char *name;
    Field *fields;
    int32_t nfields;
    int32_t *dense; /* field number -> index + 1 */
    uint32_t ndense;
    int32_t *required;
    int32_t nrequired;
    int32_t *u64; /* singular uint64/fixed64 fields of INTEGER columns: checked once their last value is in */
    int32_t nu64;
    int32_t seen_words;
    int32_t noneofs;
    int32_t has_maps;
} MsgPlan;

typedef struct {
    int closed;
    int32_t n;
    int32_t *numbers; /* sorted */
    char **names;     /* by position in numbers */
    uint32_t *name_lens;
    int32_t min, max;
    int32_t *dense; /* number - min -> index + 1, when the range is small */
} EnumPlan;

typedef struct {
    uint8_t kind, nullable;
    int32_t group;
    int32_t nchildren;
    int32_t *children;
    int32_t enum_id;
    int32_t enum_default;
    int32_t var_idx; /* index among columns with a data buffer, or -1 */
    uint32_t esize;  /* bytes per slot */
    uint8_t offsets; /* slots hold lengths at [slot + 1] (VAR, LIST) */
} ColPlan;

typedef struct {
    int32_t ncols;
    int32_t *cols;
} GroupPlan;

typedef struct {
    PyObject_HEAD
    ColPlan *cols;
    int32_t ncols;
    GroupPlan *groups;
    int32_t ngroups;
    MsgPlan *msgs;
    int32_t nmsgs;
    EnumPlan *enums;
    int32_t nenums;
    int32_t root_msg, root_col, nvar;
    int32_t struct_plan, value_plan, list_plan;
    int framed, detect_unknown;
    /* framed: the message indexes a frame must name (registry/confluent.py message_indexes) */
    int64_t *frame_path;
    int32_t frame_depth;
} PlanObject;

/* ---------------------------------------------------------------- per-batch state */

typedef struct {
    uint8_t *slots;
    uint8_t *valid;
    uint8_t *data;
    size_t dlen, dcap;
} ColBuf;

typedef struct {
    int64_t n, cap;
} GroupBuf;

typedef struct {
    int32_t field;
    uint32_t seq;
    uint8_t kstr, has_val;
    uint64_t ksort; /* integer keys, biased so that unsigned order is the key's order */
    uint64_t kraw, vraw;
    const uint8_t *kp, *vp, *ep;
    uint32_t klen, vlen, elen;
} Entry;

typedef struct {
    int32_t col;
    int32_t kind;
    int64_t row;
    const uint8_t *p;
    size_t n;
} Chunk;

typedef struct {
    PlanObject *plan;
    ColBuf *cb;
    GroupBuf *gb;
    Entry *ents;
    size_t nents, capents;
    uint32_t seq;
    Chunk *chunks;
    size_t nchunks, capchunks;
    /* the row being decoded */
    int64_t row;
    int unknown, invalid, required;
    char why[400]; /* why the row does not parse (or is escaped) */
    char bad[400]; /* why a parsed row is invalid */
    /* results */
    int64_t *fail_rows;
    uint8_t *fail_kinds;
    char **fail_msgs;
    size_t nfail, capfail;
    int64_t *unknown_rows, *escape_rows;
    size_t nunknown, capunknown, nescape, capescape;
    int64_t nrows;
    /* rollback of a failed row */
    int64_t *snap_groups;
    size_t *snap_vars;
    size_t snap_chunks;
    int32_t *var_cols;
} Ctx;

typedef struct {
    PyObject_HEAD
    Ctx *c;
    struct ArrowArray *exported;
} BatchObject;

static PyTypeObject PlanType;
static PyTypeObject BatchType;

/* ---------------------------------------------------------------- small helpers */

static int grow(void **p, size_t *cap, size_t need, size_t esize) {
    if (need <= *cap) return OK;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * esize);
    if (!q) return E_NOMEM;
    *p = q;
    *cap = c;
    return OK;
}

static int perr(Ctx *c, const char *what) {
    if (!c->why[0]) snprintf(c->why, sizeof c->why, "%s", what);
    return E_PARSE;
}

static int escape(Ctx *c, const char *what) {
    snprintf(c->why, sizeof c->why, "%s", what);
    return E_ESCAPE;
}

static void invalid(Ctx *c, const char *fmt, const char *name, long long a, long long b) {
    if (!c->invalid) {
        char text[300];
        snprintf(text, sizeof text, fmt, a, b);
        snprintf(c->bad, sizeof c->bad, "%s: %s", name, text);
    }
    c->invalid = 1;
}

static inline int rd_varint(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
    const uint8_t *p = *pp;
    if (p < end && !(*p & 0x80)) {
        *out = *p;
        *pp = p + 1;
        return OK;
    }
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) return E_PARSE;
        uint64_t b = *p++;
        v |= (b & 0x7f) << (7 * i); /* a 10th byte's high bits fall off, as in upb */
        if (!(b & 0x80)) {
            *out = v;
            *pp = p;
            return OK;
        }
    }
    return E_PARSE;
}

/* upb: a tag is at most 5 bytes and below 2^32. */
static inline int rd_tag(const uint8_t **pp, const uint8_t *end, uint32_t *tag) {
    const uint8_t *p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 5; i++) {
        if (p >= end) return E_PARSE;
        uint64_t b = *p++;
        v |= (b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (v > 0xffffffffULL) return E_PARSE;
            *tag = (uint32_t)v;
            *pp = p;
            return OK;
        }
    }
    return E_PARSE;
}

static inline uint32_t rd_le32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t rd_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static int utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ULL)) {
                i += 8;
                continue;
            }
        }
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        if (b >= 0xc2 && b <= 0xdf) {
            if (i + 1 >= n || (s[i + 1] & 0xc0) != 0x80) return 0;
            i += 2;
        } else if (b >= 0xe0 && b <= 0xef) {
            if (i + 2 >= n) return 0;
            uint8_t b1 = s[i + 1];
            if ((b1 & 0xc0) != 0x80 || (s[i + 2] & 0xc0) != 0x80) return 0;
            if (b == 0xe0 && b1 < 0xa0) return 0; /* overlong */
            if (b == 0xed && b1 > 0x9f) return 0; /* surrogate */
            i += 3;
        } else if (b >= 0xf0 && b <= 0xf4) {
            if (i + 3 >= n) return 0;
            uint8_t b1 = s[i + 1];
            if ((b1 & 0xc0) != 0x80 || (s[i + 2] & 0xc0) != 0x80 || (s[i + 3] & 0xc0) != 0x80) return 0;
            if (b == 0xf0 && b1 < 0x90) return 0; /* overlong */
            if (b == 0xf4 && b1 > 0x8f) return 0; /* past U+10FFFF */
            i += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static int enum_index(const EnumPlan *e, int32_t number) {
    if (e->dense) {
        if (number < e->min || number > e->max) return -1;
        return e->dense[(int64_t)number - e->min] - 1;
    }
    int32_t lo = 0, hi = e->n - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (e->numbers[mid] == number) return mid;
        if (e->numbers[mid] < number) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static inline int32_t field_index(const MsgPlan *mp, uint32_t number) {
    if (number < mp->ndense) return mp->dense[number] - 1;
    int32_t lo = 0, hi = mp->nfields - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (mp->fields[mid].number == number) return mid;
        if (mp->fields[mid].number < number) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

static inline int wire_type(int vt) {
    switch (vt) {
    case VT_FIXED32: case VT_SFIXED32: case VT_FLOAT: return 5;
    case VT_FIXED64: case VT_SFIXED64: case VT_DOUBLE: return 1;
    case VT_STRING: case VT_BYTES: case VT_MESSAGE: return 2;
    default: return 0;
    }
}

/* A value's integer meaning (int32 truncation, zigzag, ...); unsigned 64-bit types are returned as is. */
static inline int64_t int_value(int vt, uint64_t u) {
    switch (vt) {
    case VT_INT32: case VT_SFIXED32: case VT_ENUM: return (int32_t)(uint32_t)u;
    case VT_UINT32: case VT_FIXED32: return (uint32_t)u;
    case VT_SINT32: {
        uint32_t x = (uint32_t)u;
        return (int32_t)((x >> 1) ^ (0u - (x & 1)));
    }
    case VT_SINT64: return (int64_t)((u >> 1) ^ (0ULL - (u & 1)));
    case VT_BOOL: return u != 0;
    default: return (int64_t)u;
    }
}

static inline int is_unsigned64(int vt) { return vt == VT_UINT64 || vt == VT_FIXED64; }

/* A map key as an unsigned number whose order is the key's (Python's) order. */
static inline uint64_t key_order(int vt, uint64_t u) {
    switch (vt) {
    case VT_UINT32: case VT_FIXED32: case VT_UINT64: case VT_FIXED64: case VT_BOOL:
        return is_unsigned64(vt) ? u : (uint64_t)int_value(vt, u);
    default: return (uint64_t)int_value(vt, u) ^ 0x8000000000000000ULL;
    }
}

/* The next tag's field number and wire type; a malformed tag does not parse, nor does field number 0
 * unless `zero_ok` (upb reads it as an unknown field of a message without fields: google.protobuf.Empty,
 * a oneof's marker). */
static inline int next_tag_in(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t *num, uint32_t *wt,
                              int zero_ok) {
    uint32_t tag;
    if (**pp < 0x80) tag = *(*pp)++;
    else if (rd_tag(pp, end, &tag)) return perr(c, "malformed tag");
    *num = tag >> 3;
    *wt = tag & 7;
    return *num || zero_ok ? OK : perr(c, "field number 0");
}

static inline int next_tag(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t *num, uint32_t *wt) {
    return next_tag_in(c, pp, end, num, wt, 0);
}

/* ---------------------------------------------------------------- skipping unknown fields */

static int skip_group(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t number, int level);

static int skip_value(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t wt, uint32_t number, int level) {
    const uint8_t *p = *pp;
    uint64_t v;
    switch (wt) {
    case 0:
        if (rd_varint(&p, end, &v)) return perr(c, "truncated or malformed varint");
        break;
    case 1:
        if (end - p < 8) return perr(c, "truncated 64-bit value");
        p += 8;
        break;
    case 5:
        if (end - p < 4) return perr(c, "truncated 32-bit value");
        p += 4;
        break;
    case 2:
        if (rd_varint(&p, end, &v)) return perr(c, "truncated or malformed length");
        if (v > (uint64_t)(end - p)) return perr(c, "a length runs past the end of its message");
        p += v;
        break;
    case 3: {
        int rc = skip_group(c, &p, end, number, level + 1);
        if (rc) return rc;
        break;
    }
    default:
        return perr(c, wt == 4 ? "an end-group tag outside a group" : "invalid wire type");
    }
    *pp = p;
    return OK;
}

static int skip_group(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t number, int level) {
    if (level > MAX_LEVEL) return perr(c, "nested deeper than 100 levels");
    const uint8_t *p = *pp;
    for (;;) {
        if (p >= end) return perr(c, "unterminated group");
        uint32_t tag; /* upb skips a group by wire types alone: field number 0 is fine in here */
        if (rd_tag(&p, end, &tag)) return perr(c, "malformed tag");
        uint32_t num = tag >> 3, wt = tag & 7;
        int rc;
        if (wt == 4) {
            if (num != number) return perr(c, "mismatched end-group tag");
            *pp = p;
            return OK;
        }
        if ((rc = skip_value(c, &p, end, wt, num, level))) return rc;
    }
}

/* Skips a field its reader does not know: an unknown field of the message being read. */
static int skip_unknown(Ctx *c, const uint8_t **pp, const uint8_t *end, uint32_t wt, uint32_t num, int level) {
    int rc = skip_value(c, pp, end, wt, num, level);
    if (!rc) c->unknown = 1;
    return rc;
}

/* One value of wire type `wt`: an integer/fixed bit pattern in v->u, or a span in v->p/v->n. */
typedef struct {
    uint64_t u;
    const uint8_t *p;
    uint32_t n;
} WVal;

static inline int read_value(Ctx *c, const uint8_t **pp, const uint8_t *end, int wt, WVal *v) {
    const uint8_t *p = *pp;
    switch (wt) {
    case 0:
        if (rd_varint(&p, end, &v->u)) return perr(c, "truncated or malformed varint");
        break;
    case 1:
        if (end - p < 8) return perr(c, "truncated 64-bit value");
        v->u = rd_le64(p);
        p += 8;
        break;
    case 5:
        if (end - p < 4) return perr(c, "truncated 32-bit value");
        v->u = rd_le32(p);
        p += 4;
        break;
    default: {
        uint64_t n;
        if (rd_varint(&p, end, &n)) return perr(c, "truncated or malformed length");
        if (n > (uint64_t)(end - p)) return perr(c, "a length runs past the end of its message");
        v->p = p;
        v->n = (uint32_t)n;
        p += n;
    }
    }
    *pp = p;
    return OK;
}

/* ---------------------------------------------------------------- columns */

static int group_grow(Ctx *c, int32_t g, int64_t need) {
    PlanObject *pl = c->plan;
    GroupBuf *gb = &c->gb[g];
    int64_t cap = gb->cap ? gb->cap : 8;
    while (cap < need) cap *= 2;
    const GroupPlan *gp = &pl->groups[g];
    for (int32_t k = 0; k < gp->ncols; k++) {
        int32_t col = gp->cols[k];
        const ColPlan *cp = &pl->cols[col];
        ColBuf *b = &c->cb[col];
        if (cp->esize) {
            size_t old = b->slots ? (size_t)(gb->cap + cp->offsets) * cp->esize : 0;
            size_t now = (size_t)(cap + cp->offsets) * cp->esize;
            uint8_t *q = realloc(b->slots, now);
            if (!q) return E_NOMEM;
            memset(q + old, 0, now - old);
            b->slots = q;
        }
        if (cp->nullable) {
            size_t old = b->valid ? (size_t)gb->cap : 0;
            uint8_t *q = realloc(b->valid, (size_t)cap);
            if (!q) return E_NOMEM;
            memset(q + old, 0, (size_t)cap - old);
            b->valid = q;
        }
    }
    gb->cap = cap;
    return OK;
}

static inline int64_t group_open(Ctx *c, int32_t g) {
    GroupBuf *gb = &c->gb[g];
    if (gb->n == gb->cap && group_grow(c, g, gb->n + 1)) return -1;
    return gb->n++;
}

/* A new item of list column `list` at `slot`: its slot in the item group, or -1 (out of memory). */
static inline int64_t list_append(Ctx *c, int32_t list, int64_t slot, int32_t *item) {
    const ColPlan *cp = &c->plan->cols[list];
    *item = cp->children[0];
    int64_t s = group_open(c, c->plan->cols[*item].group);
    if (s >= 0) ((int32_t *)c->cb[list].slots)[slot + 1]++;
    return s;
}

static inline int data_reserve(ColBuf *b, size_t more) {
    if (b->dlen + more > (size_t)INT32_MAX) return E_OVERFLOW;
    return grow((void **)&b->data, &b->dcap, b->dlen + more, 1);
}

/* Sets the bytes of a var column's slot; the slot's old bytes are the data's tail (see the top). */
static int var_set(Ctx *c, int32_t col, int64_t slot, const void *p, size_t n) {
    ColBuf *b = &c->cb[col];
    int32_t *len = (int32_t *)b->slots;
    b->dlen -= (size_t)len[slot + 1];
    int rc = data_reserve(b, n);
    if (rc) return rc;
    if (n) memcpy(b->data + b->dlen, p, n);
    b->dlen += n;
    len[slot + 1] = (int32_t)n;
    return OK;
}

static inline void set_valid(Ctx *c, int32_t col, int64_t slot) {
    if (c->plan->cols[col].nullable) c->cb[col].valid[slot] = 1;
}

static void clear_slot(Ctx *c, int32_t col, int64_t slot) {
    const ColPlan *cp = &c->plan->cols[col];
    ColBuf *b = &c->cb[col];
    if (cp->nullable) b->valid[slot] = 0;
    if (cp->kind == C_VAR) {
        int32_t *len = (int32_t *)b->slots;
        b->dlen -= (size_t)len[slot + 1];
        len[slot + 1] = 0;
    }
}

static void too_big(Ctx *c, const char *name, uint64_t u) {
    if (!c->invalid)
        snprintf(c->bad, sizeof c->bad, "%s: %llu is past INTEGER's range (at most 2^63-1); set "
                 "SINK_BIGQUERY_UINT64_COLUMN_TYPE=NUMERIC or STRING to keep such values", name, (unsigned long long)u);
    c->invalid = 1;
}

/* Scalar `v` of value type `vt` into column `col` at `slot`. `last_wins`: a singular field, whose value
 * may still be replaced; its uint64 range is checked at the end of its message (MsgPlan.u64). */
static int store_scalar(Ctx *c, const char *name, int vt, int32_t col, int64_t slot, const WVal *v, int last_wins) {
    const ColPlan *cp = &c->plan->cols[col];
    ColBuf *b = &c->cb[col];
    if (cp->nullable) b->valid[slot] = 1;
    switch (cp->kind) {
    case C_I64:
        if (is_unsigned64(vt) && v->u > (uint64_t)INT64_MAX && !last_wins) too_big(c, name, v->u);
        ((int64_t *)b->slots)[slot] = int_value(vt, v->u);
        return OK;
    case C_F64: {
        double d;
        if (vt == VT_FLOAT) {
            float f;
            uint32_t bits = (uint32_t)v->u;
            memcpy(&f, &bits, 4);
            d = f;
        } else {
            memcpy(&d, &v->u, 8);
        }
        ((double *)b->slots)[slot] = d;
        return OK;
    }
    case C_BOOL:
        b->slots[slot] = v->u != 0;
        return OK;
    case C_ENUM:
        ((int32_t *)b->slots)[slot] = (int32_t)(uint32_t)v->u ^ cp->enum_default;
        return OK;
    case C_U64TXT:
        ((uint64_t *)b->slots)[slot] = v->u;
        return OK;
    case C_VAR:
        return var_set(c, col, slot, v->p, v->n);
    case C_DEC: {
        /* NUMERIC (scale 9) of an unsigned 64-bit value: value * 10^9 fits 128 bits */
        unsigned __int128 x = (unsigned __int128)v->u * 1000000000u;
        uint64_t lo = (uint64_t)x, hi = (uint64_t)(x >> 64);
        memcpy(b->slots + (size_t)slot * 16, &lo, 8);
        memcpy(b->slots + (size_t)slot * 16 + 8, &hi, 8);
        return OK;
    }
    default:
        return OK;
    }
}

static int add_chunk(Ctx *c, int32_t col, int64_t slot, int kind, const uint8_t *p, size_t n) {
    if (grow((void **)&c->chunks, &c->capchunks, c->nchunks + 1, sizeof(Chunk))) return E_NOMEM;
    Chunk *ch = &c->chunks[c->nchunks++];
    ch->col = col;
    ch->kind = kind;
    ch->row = c->row;
    ch->p = p ? p : (const uint8_t *)""; /* a map entry without its value: the empty (default) message */
    ch->n = n;
    ((uint32_t *)c->cb[col].slots)[slot] = (uint32_t)c->nchunks; /* index + 1; 0 = none */
    set_valid(c, col, slot);
    return OK;
}

/* ---------------------------------------------------------------- well-known types */

/* A message of up to three scalar fields numbered 1..nf (Timestamp, Duration, Date, wrappers): the
 * last value of each wins; anything else is an unknown field. */
static int small_msg(Ctx *c, const uint8_t *p, const uint8_t *end, int level, const uint8_t *vts, int nf,
                     int utf8, WVal *out) {
    if (level > MAX_LEVEL) return perr(c, "nested deeper than 100 levels");
    int rc;
    while (p < end) {
        uint32_t num, wt;
        if ((rc = next_tag(c, &p, end, &num, &wt))) return rc;
        if (num <= (uint32_t)nf && wt == (uint32_t)wire_type(vts[num - 1])) {
            if ((rc = read_value(c, &p, end, (int)wt, &out[num - 1]))) return rc;
            if (vts[num - 1] == VT_STRING && utf8 && !utf8_valid(out[num - 1].p, out[num - 1].n))
                return perr(c, "invalid UTF-8 in a string field");
        } else if ((rc = skip_unknown(c, &p, end, wt, num, level))) {
            return rc;
        }
    }
    return OK;
}

static const uint8_t TWO_INTS[] = {VT_INT64, VT_INT32};
static const uint8_t THREE_INT32[] = {VT_INT32, VT_INT32, VT_INT32};

static int days_in_month(int64_t y, int64_t m) {
    static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    if (m == 2 && ((y % 4 == 0 && y % 100 != 0) || y % 400 == 0)) return 29;
    return days[m - 1];
}

/* Days from 1970-01-01 to a valid proleptic Gregorian date (Howard Hinnant's days_from_civil). */
static int64_t days_from_civil(int64_t y, int64_t m, int64_t d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* ---------------------------------------------------------------- Struct / Value / ListValue -> JSON */

static int decode_msg(Ctx *c, const MsgPlan *mp, const uint8_t *p, const uint8_t *end, int64_t slot, int level,
                      int keep);
static int json_value(Ctx *c, ColBuf *b, const uint8_t *p, const uint8_t *end, int level);
static int json_struct(Ctx *c, ColBuf *b, const uint8_t *p, const uint8_t *end, int level);

static inline int put(ColBuf *b, const void *s, size_t n) {
    int rc = data_reserve(b, n);
    if (rc) return rc;
    memcpy(b->data + b->dlen, s, n);
    b->dlen += n;
    return OK;
}

/* What json's encode_basestring_ascii writes: ASCII only, \uXXXX (lower-case) for the rest. */
static int json_string(ColBuf *b, const uint8_t *s, size_t n) {
    int rc = data_reserve(b, n * 12 + 2);
    if (rc) return rc;
    static const char hex[] = "0123456789abcdef";
    uint8_t *o = b->data + b->dlen, *o0 = o;
    *o++ = '"';
    size_t i = 0;
    while (i < n) {
        uint32_t ch = s[i];
        if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') {
            *o++ = (uint8_t)ch;
            i++;
            continue;
        }
        if (ch < 0x80) {
            i++;
            *o++ = '\\';
            switch (ch) {
            case '"': *o++ = '"'; break;
            case '\\': *o++ = '\\'; break;
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            default:
                *o++ = 'u'; *o++ = '0'; *o++ = '0';
                *o++ = (uint8_t)hex[ch >> 4]; *o++ = (uint8_t)hex[ch & 15];
            }
            continue;
        }
        uint32_t cp;
        if (ch < 0xe0) {
            cp = ((ch & 0x1f) << 6) | (s[i + 1] & 0x3f);
            i += 2;
        } else if (ch < 0xf0) {
            cp = ((ch & 0x0f) << 12) | ((uint32_t)(s[i + 1] & 0x3f) << 6) | (s[i + 2] & 0x3f);
            i += 3;
        } else {
            cp = ((ch & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3f) << 12) | ((uint32_t)(s[i + 2] & 0x3f) << 6) |
                 (s[i + 3] & 0x3f);
            i += 4;
        }
        uint32_t units[2];
        int nu = 1;
        if (cp >= 0x10000) {
            cp -= 0x10000;
            units[0] = 0xd800 | (cp >> 10);
            units[1] = 0xdc00 | (cp & 0x3ff);
            nu = 2;
        } else {
            units[0] = cp;
        }
        for (int k = 0; k < nu; k++) {
            *o++ = '\\'; *o++ = 'u';
            *o++ = (uint8_t)hex[(units[k] >> 12) & 15]; *o++ = (uint8_t)hex[(units[k] >> 8) & 15];
            *o++ = (uint8_t)hex[(units[k] >> 4) & 15]; *o++ = (uint8_t)hex[units[k] & 15];
        }
    }
    *o++ = '"';
    b->dlen += (size_t)(o - o0);
    return OK;
}

static int json_number(Ctx *c, ColBuf *b, double d) {
    /* NaN or +-Infinity: JSON has no spelling for them, json_format refuses them. The row fails naming the
     * Value's path (`attrs['k'][0]`), which only the reference tracks: it decodes the row. */
    if (d - d != 0.0) return escape(c, "a google.protobuf.Value holds NaN or Infinity");
    /* repr(float), as json.dumps writes it, without making a Python object */
    char *text = PyOS_double_to_string(d, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!text) return E_NOMEM;
    int rc = put(b, text, strlen(text));
    PyMem_Free(text);
    return rc;
}

static int validate_discarded(Ctx *c, int32_t plan, const uint8_t *p, const uint8_t *end, int level) {
    return decode_msg(c, &c->plan->msgs[plan], p, end, -1, level, 0);
}

static int push_entry(Ctx *c, const Entry *e) {
    if (grow((void **)&c->ents, &c->capents, c->nents + 1, sizeof(Entry))) return E_NOMEM;
    c->ents[c->nents++] = *e;
    return OK;
}

static int entry_cmp(const void *a, const void *b) {
    const Entry *x = a, *y = b;
    if (x->field != y->field) return x->field < y->field ? -1 : 1;
    if (x->kstr) {
        uint32_t n = x->klen < y->klen ? x->klen : y->klen;
        int r = n ? memcmp(x->kp, y->kp, n) : 0;
        if (r) return r;
        if (x->klen != y->klen) return x->klen < y->klen ? -1 : 1;
    } else if (x->ksort != y->ksort) {
        return x->ksort < y->ksort ? -1 : 1;
    }
    return x->seq < y->seq ? -1 : (x->seq > y->seq);
}

static inline int same_key(const Entry *x, const Entry *y) {
    if (x->field != y->field) return 0;
    if (x->kstr) return x->klen == y->klen && (!x->klen || !memcmp(x->kp, y->kp, x->klen));
    return x->ksort == y->ksort;
}

static void sort_entries(Entry *e, size_t n) {
    if (n > 24) {
        qsort(e, n, sizeof(Entry), entry_cmp);
        return;
    }
    for (size_t i = 1; i < n; i++) {
        Entry t = e[i];
        size_t j = i;
        while (j > 0 && entry_cmp(&e[j - 1], &t) > 0) {
            e[j] = e[j - 1];
            j--;
        }
        e[j] = t;
    }
}

static int json_struct(Ctx *c, ColBuf *b, const uint8_t *p, const uint8_t *end, int level) {
    if (level > MAX_LEVEL) return perr(c, "nested deeper than 100 levels");
    PlanObject *pl = c->plan;
    size_t base = c->nents;
    int rc;
    while (p < end) {
        uint32_t num, wt;
        if ((rc = next_tag(c, &p, end, &num, &wt))) return rc;
        if (num != 1 || wt != 2) {
            if ((rc = skip_unknown(c, &p, end, wt, num, level))) return rc;
            continue;
        }
        WVal ent = {0, NULL, 0};
        if ((rc = read_value(c, &p, end, 2, &ent))) return rc;
        if (level + 1 > MAX_LEVEL) return perr(c, "nested deeper than 100 levels");
        Entry e;
        memset(&e, 0, sizeof e);
        e.kstr = 1;
        e.seq = c->seq++;
        int dropped = 0, values = 0;
        const uint8_t *q = ent.p, *qend = ent.p + ent.n;
        while (q < qend) {
            uint32_t n2, w2;
            if ((rc = next_tag(c, &q, qend, &n2, &w2))) return rc;
            if (n2 <= 2 && w2 == 2) {
                WVal v = {0, NULL, 0};
                if ((rc = read_value(c, &q, qend, 2, &v))) return rc;
                if (n2 == 1) {
                    if (!utf8_valid(v.p, v.n)) return perr(c, "invalid UTF-8 in a google.protobuf.Struct key");
                    e.kp = v.p;
                    e.klen = v.n;
                } else {
                    if (values++) return escape(c, "a google.protobuf.Struct entry holds its value twice (merged)");
                    e.vp = v.p;
                    e.vlen = v.n;
                    e.has_val = 1;
                }
            } else {
                if ((rc = skip_value(c, &q, qend, w2, n2, level + 1))) return rc;
                dropped = 1;
            }
        }
        if (dropped) { /* upb keeps such an entry as an unknown field of the Struct */
            c->unknown = 1;
            if (e.has_val && (rc = validate_discarded(c, pl->value_plan, e.vp, e.vp + e.vlen, level + 2))) return rc;
            continue;
        }
        if ((rc = push_entry(c, &e))) return rc;
    }
    size_t top = c->nents;
    sort_entries(c->ents + base, top - base);
    if ((rc = put(b, "{", 1))) return rc;
    for (size_t i = base; i < top;) {
        size_t j = i + 1;
        while (j < top && same_key(&c->ents[i], &c->ents[j])) j++;
        for (size_t k = i; k + 1 < j; k++) { /* earlier entries of the same key: parsed, then replaced */
            Entry *e = &c->ents[k];
            if (e->has_val && (rc = validate_discarded(c, pl->value_plan, e->vp, e->vp + e->vlen, level + 2)))
                return rc;
        }
        Entry e = c->ents[j - 1];
        if (i != base && (rc = put(b, ", ", 2))) return rc;
        if ((rc = json_string(b, e.kp, e.klen)) || (rc = put(b, ": ", 2))) return rc;
        if ((rc = json_value(c, b, e.vp, e.vp + e.vlen, level + 2))) return rc;
        i = j;
    }
    c->nents = base;
    return put(b, "}", 1);
}

static int json_list(Ctx *c, ColBuf *b, const uint8_t *p, const uint8_t *end, int level) {
    if (level > MAX_LEVEL) return perr(c, "nested deeper than 100 levels");
    int rc, first = 1;
    if ((rc = put(b, "[", 1))) return rc;
    while (p < end) {
        uint32_t num, wt;
        if ((rc = next_tag(c, &p, end, &num, &wt))) return rc;
        if (num != 1 || wt != 2) {
            if ((rc = skip_unknown(c, &p, end, wt, num, level))) return rc;
            continue;
        }
        WVal v = {0, NULL, 0};
        if ((rc = read_value(c, &p, end, 2, &v))) return rc;
        if (!first && (rc = put(b, ", ", 2))) return rc;
        first = 0;
        if ((rc = json_value(c, b, v.p, v.p + v.n, level + 1))) return rc;
    }
    return put(b, "]", 1);
}

enum { JV_NONE = 0, JV_NULL = 1, JV_NUMBER, JV_STRING, JV_BOOL, JV_STRUCT, JV_LIST };

static int json_value(Ctx *c, ColBuf *b, const uint8_t *p, const uint8_t *end, int level) {
    if (level > MAX_LEVEL) return perr(c, "nested deeper than 100 levels");
    PlanObject *pl = c->plan;
    int kind = JV_NONE, rc;
    WVal last = {0, NULL, 0};
    static const uint8_t wts[] = {0, 0, 1, 2, 0, 2, 2};
    while (p < end) {
        uint32_t num, wt;
        if ((rc = next_tag(c, &p, end, &num, &wt))) return rc;
        if (num > 6 || wt != wts[num]) {
            if ((rc = skip_unknown(c, &p, end, wt, num, level))) return rc;
            continue;
        }
        WVal v = {0, NULL, 0};
        if ((rc = read_value(c, &p, end, (int)wt, &v))) return rc;
        if (num == JV_STRING && !utf8_valid(v.p, v.n)) return perr(c, "invalid UTF-8 in a google.protobuf.Value");
        /* `kind` is a oneof: a message member replaced by another member was parsed, then dropped; the
         * same message member twice is merged, which only the reference does */
        if (kind == JV_STRUCT || kind == JV_LIST) {
            if ((int)num == kind) return escape(c, "a google.protobuf.Value holds its message twice (merged)");
            int32_t plan = kind == JV_STRUCT ? pl->struct_plan : pl->list_plan;
            if ((rc = validate_discarded(c, plan, last.p, last.p + last.n, level + 1))) return rc;
        }
        kind = (int)num;
        last = v;
    }
    switch (kind) {
    case JV_NUMBER: {
        double d;
        memcpy(&d, &last.u, 8);
        return json_number(c, b, d);
    }
    case JV_STRING: return json_string(b, last.p, last.n);
    case JV_BOOL: return last.u ? put(b, "true", 4) : put(b, "false", 5);
    case JV_STRUCT: return json_struct(c, b, last.p, last.p + last.n, level + 1);
    case JV_LIST: return json_list(c, b, last.p, last.p + last.n, level + 1);
    default: return put(b, "null", 4);
    }
}

/* ---------------------------------------------------------------- messages */

/* A message value of field `f` into column `col` at `slot` (or, with col < 0, only validated); the
 * value message sits at level + 1. */
static int put_message(Ctx *c, const Field *f, int32_t col, int64_t slot, const uint8_t *p, const uint8_t *end,
                       int level, int keep) {
    PlanObject *pl = c->plan;
    if (col < 0) return decode_msg(c, &pl->msgs[f->tsub], p, end, -1, level + 1, keep);
    int rc;
    switch (f->kind) {
    case K_RECORD:
        set_valid(c, col, slot);
        return decode_msg(c, &pl->msgs[f->sub], p, end, slot, level + 1, 1);
    case K_TIMESTAMP: {
        WVal v[2] = {{0, NULL, 0}, {0, NULL, 0}};
        if ((rc = small_msg(c, p, end, level + 1, TWO_INTS, 2, 0, v))) return rc;
        int64_t seconds = (int64_t)v[0].u, nanos = (int32_t)(uint32_t)v[1].u, micros = 0;
        if (seconds < TS_MIN_SECONDS || seconds > TS_MAX_SECONDS)
            invalid(c, "Timestamp seconds %lld is outside 0001-01-01..9999-12-31 (nanos %lld)", f->name, seconds, nanos);
        else if (nanos < 0 || nanos > NANOS_MAX)
            invalid(c, "Timestamp nanos %lld is outside 0..999999999 (seconds %lld)", f->name, nanos, seconds);
        else
            micros = seconds * 1000000 + nanos / 1000; /* nanos >= 0: truncation is the reference's floor */
        set_valid(c, col, slot);
        ((int64_t *)c->cb[col].slots)[slot] = micros;
        return OK;
    }
    case K_DURATION: {
        WVal v[2] = {{0, NULL, 0}, {0, NULL, 0}};
        if ((rc = small_msg(c, p, end, level + 1, TWO_INTS, 2, 0, v))) return rc;
        int64_t seconds = (int64_t)v[0].u, nanos = (int32_t)(uint32_t)v[1].u;
        if (seconds < -DURATION_MAX_SECONDS || seconds > DURATION_MAX_SECONDS)
            invalid(c, "Duration seconds %lld is outside +-315576000000 (nanos %lld)", f->name, seconds, nanos);
        else if (nanos < -NANOS_MAX || nanos > NANOS_MAX)
            invalid(c, "Duration nanos %lld is outside +-999999999 (seconds %lld)", f->name, nanos, seconds);
        else if ((seconds > 0 && nanos < 0) || (seconds < 0 && nanos > 0))
            invalid(c, "Duration seconds %lld and nanos %lld have different signs", f->name, seconds, nanos);
        set_valid(c, col, slot);
        const ColPlan *cp = &pl->cols[col];
        ((int64_t *)c->cb[cp->children[0]].slots)[slot] = seconds;
        ((int64_t *)c->cb[cp->children[1]].slots)[slot] = nanos;
        return OK;
    }
    case K_DATE: {
        WVal v[3] = {{0, NULL, 0}, {0, NULL, 0}, {0, NULL, 0}};
        if ((rc = small_msg(c, p, end, level + 1, THREE_INT32, 3, 0, v))) return rc;
        int64_t y = (int32_t)(uint32_t)v[0].u, m = (int32_t)(uint32_t)v[1].u, d = (int32_t)(uint32_t)v[2].u;
        int32_t days = 0;
        if (y < 1 || y > 9999 || m < 1 || m > 12 || d < 1 || d > days_in_month(y, m)) {
            if (!c->invalid)
                snprintf(c->bad, sizeof c->bad, "%s: google.type.Date %lld-%lld-%lld is not a valid DATE", f->name,
                         (long long)y, (long long)m, (long long)d);
            c->invalid = 1;
        } else {
            days = (int32_t)days_from_civil(y, m, d);
        }
        set_valid(c, col, slot);
        ((int32_t *)c->cb[col].slots)[slot] = days;
        return OK;
    }
    case K_WRAPPER: {
        WVal v = {0, NULL, 0};
        if ((rc = small_msg(c, p, end, level + 1, &f->aux_vt, 1, f->flags & F_AUX_UTF8, &v))) return rc;
        return store_scalar(c, f->name, f->aux_vt, col, slot, &v, 0);
    }
    case K_STRUCT: case K_VALUE: case K_LIST: {
        ColBuf *b = &c->cb[col];
        int32_t *len = (int32_t *)b->slots;
        b->dlen -= (size_t)len[slot + 1];
        size_t start = b->dlen;
        if (f->kind == K_STRUCT) rc = json_struct(c, b, p, end, level + 1);
        else if (f->kind == K_VALUE) rc = json_value(c, b, p, end, level + 1);
        else rc = json_list(c, b, p, end, level + 1);
        if (rc) return rc;
        len[slot + 1] = (int32_t)(b->dlen - start);
        set_valid(c, col, slot);
        return OK;
    }
    case K_CUT:
        if ((rc = decode_msg(c, &pl->msgs[f->tsub], p, end, -1, level + 1, 1))) return rc;
        return add_chunk(c, col, slot, CUT_MESSAGE, p, (size_t)(end - p));
    default:
        return decode_msg(c, &pl->msgs[f->tsub], p, end, -1, level + 1, keep);
    }
}

static int oneof_set(Ctx *c, const MsgPlan *mp, int16_t *cases, const Field *f, int32_t fi, int64_t slot, int keep) {
    int16_t cur = cases[f->oneof];
    if (cur == fi) return OK;
    if (cur >= 0 && keep) {
        const Field *g = &mp->fields[cur];
        if (g->vt == VT_MESSAGE) return escape(c, "a oneof switches away from a message member");
        if (g->col >= 0) clear_slot(c, g->col, slot);
    }
    cases[f->oneof] = (int16_t)fi;
    return OK;
}

/* Checks a string value: proto3 (validated) strings with bad UTF-8 do not parse; an unvalidated (proto2)
 * one that is written is left to the reference, which fails the row in its own way. */
static inline int check_string(Ctx *c, const Field *f, int32_t col, const WVal *v) {
    if (f->vt != VT_STRING || utf8_valid(v->p, v->n)) return OK;
    if (f->flags & F_UTF8) return perr(c, "invalid UTF-8 in a string field");
    if (col >= 0) return escape(c, "a proto2 string field holds invalid UTF-8");
    return OK;
}

static int map_entry(Ctx *c, const MsgPlan *mp, int32_t fi, const uint8_t *p, const uint8_t *end, int level, int keep) {
    PlanObject *pl = c->plan;
    const Field *f = &mp->fields[fi];
    const MsgPlan *ep = &pl->msgs[f->sub];
    const Field *kf = &ep->fields[0], *vf = &ep->fields[1];
    int elevel = level + 1, rc;
    if (elevel > MAX_LEVEL) return perr(c, "nested deeper than 100 levels");
    Entry e;
    memset(&e, 0, sizeof e);
    e.field = fi;
    e.seq = c->seq++;
    e.ep = p;
    e.elen = (uint32_t)(end - p);
    e.kstr = kf->vt == VT_STRING;
    e.ksort = e.kstr ? 0 : key_order(kf->vt, 0); /* a missing key is the default, 0 */
    int dropped = 0, values = 0;
    int out = f->col >= 0 && f->kind != K_CUT;
    while (p < end) {
        uint32_t num, wt;
        if ((rc = next_tag(c, &p, end, &num, &wt))) return rc;
        WVal v = {0, NULL, 0};
        if (num == 1 && wt == kf->wt) {
            if ((rc = read_value(c, &p, end, (int)wt, &v))) return rc;
            if ((rc = check_string(c, kf, out ? kf->col : -1, &v))) return rc;
            e.kraw = v.u;
            e.kp = v.p;
            e.klen = v.n;
            e.ksort = e.kstr ? 0 : key_order(kf->vt, v.u);
        } else if (num == 2 && wt == vf->wt) {
            if ((rc = read_value(c, &p, end, (int)wt, &v))) return rc;
            if (vf->vt == VT_MESSAGE) {
                if (values++) {
                    if (keep) return escape(c, "a map entry holds its message value twice (merged)");
                    if ((rc = validate_discarded(c, vf->tsub, e.vp, e.vp + e.vlen, elevel + 1))) return rc;
                }
            } else {
                if ((rc = check_string(c, vf, out ? vf->col : -1, &v))) return rc;
                if (vf->vt == VT_ENUM && (vf->flags & F_CLOSED) &&
                    enum_index(&pl->enums[vf->enum_id], (int32_t)(uint32_t)v.u) < 0) {
                    dropped = 1; /* upb: the number goes to the entry's unknown fields */
                    continue;
                }
            }
            e.vraw = v.u;
            e.vp = v.p;
            e.vlen = v.n;
            e.has_val = 1;
        } else {
            if ((rc = skip_value(c, &p, end, wt, num, elevel))) return rc;
            dropped = 1;
        }
    }
    if (!keep || dropped) {
        /* upb keeps an entry with unknown fields whole as an unknown field of the map's message */
        if (dropped && keep) c->unknown = 1;
        if (vf->vt == VT_MESSAGE && e.has_val)
            return validate_discarded(c, vf->tsub, e.vp, e.vp + e.vlen, elevel + 1);
        return OK;
    }
    return push_entry(c, &e);
}

/* The map entries of one message occurrence: by field and key, the last of each key wins (Python's
 * order of the keys, as the reference sorts them). */
static int maps_finish(Ctx *c, const MsgPlan *mp, size_t base, int64_t slot, int level) {
    PlanObject *pl = c->plan;
    size_t top = c->nents;
    int rc;
    sort_entries(c->ents + base, top - base);
    for (size_t i = base; i < top;) {
        size_t j = i + 1;
        while (j < top && same_key(&c->ents[i], &c->ents[j])) j++;
        const Field *f = &mp->fields[c->ents[i].field];
        const MsgPlan *ep = &pl->msgs[f->sub];
        const Field *kf = &ep->fields[0], *vf = &ep->fields[1];
        for (size_t k = i; k + 1 < j; k++) {
            Entry *e = &c->ents[k];
            if (vf->vt == VT_MESSAGE && e->has_val &&
                (rc = validate_discarded(c, vf->tsub, e->vp, e->vp + e->vlen, level + 2)))
                return rc;
        }
        Entry e = c->ents[j - 1];
        i = j;
        const uint8_t *vend = e.vp + e.vlen;
        if (f->col < 0) {
            if (vf->vt == VT_MESSAGE && (rc = decode_msg(c, &pl->msgs[vf->tsub], e.vp, vend, -1, level + 2, 1)))
                return rc;
            continue;
        }
        int32_t item;
        int64_t s = list_append(c, f->col, slot, &item);
        if (s < 0) return E_NOMEM;
        if (f->kind == K_CUT) {
            if (vf->vt == VT_MESSAGE && (rc = decode_msg(c, &pl->msgs[vf->tsub], e.vp, vend, -1, level + 2, 1)))
                return rc;
            if ((rc = add_chunk(c, item, s, CUT_ENTRY, e.ep, e.elen))) return rc;
            continue;
        }
        WVal k = {e.kraw, e.kp, e.klen};
        if ((rc = store_scalar(c, kf->name, kf->vt, kf->col, s, &k, 0))) return rc;
        if (vf->vt == VT_MESSAGE) {
            if ((rc = put_message(c, vf, vf->col, s, e.vp, vend, level + 1, 1))) return rc;
        } else {
            WVal v = {e.vraw, e.vp, e.vlen};
            if (!e.has_val && vf->vt == VT_ENUM) v.u = (uint32_t)pl->cols[vf->col].enum_default;
            if ((rc = store_scalar(c, vf->name, vf->vt, vf->col, s, &v, 0))) return rc;
        }
    }
    c->nents = base;
    return OK;
}

/* The packed elements of repeated scalar field `f`. */
static int packed(Ctx *c, const Field *f, const uint8_t *p, const uint8_t *end, int64_t slot, int keep) {
    PlanObject *pl = c->plan;
    int wt = f->wt;
    if ((wt == 5 && (end - p) % 4) || (wt == 1 && (end - p) % 8)) return perr(c, "a packed field's length is not a multiple of its values");
    const EnumPlan *closed = (f->vt == VT_ENUM && (f->flags & F_CLOSED)) ? &pl->enums[f->enum_id] : NULL;
    while (p < end) {
        WVal v = {0, NULL, 0};
        int rc = read_value(c, &p, end, wt, &v);
        if (rc) return rc;
        if (closed && enum_index(closed, (int32_t)(uint32_t)v.u) < 0) {
            if (keep) c->unknown = 1;
            continue;
        }
        if (f->col >= 0) {
            int32_t item;
            int64_t s = list_append(c, f->col, slot, &item);
            if (s < 0) return E_NOMEM;
            if ((rc = store_scalar(c, f->name, f->vt, item, s, &v, 0))) return rc;
        }
    }
    return OK;
}

static void check_required(Ctx *c, const MsgPlan *mp, const uint64_t *seen) {
    for (int32_t k = 0; k < mp->nrequired; k++) {
        const Field *f = &mp->fields[mp->required[k]];
        if (seen[f->seen >> 6] & (1ULL << (f->seen & 63))) continue;
        if (!c->required) {
            snprintf(c->bad, sizeof c->bad, "required field(s) missing: %s", f->name);
        } else {
            size_t n = strlen(c->bad);
            if (n + strlen(f->name) + 3 < sizeof c->bad) snprintf(c->bad + n, sizeof c->bad - n, ", %s", f->name);
        }
        c->required = 1;
    }
}

static int decode_msg(Ctx *c, const MsgPlan *mp, const uint8_t *p, const uint8_t *end, int64_t slot, int level,
                      int keep) {
    if (level > MAX_LEVEL) return perr(c, "nested deeper than 100 levels");
    PlanObject *pl = c->plan;
    uint64_t seen[MAX_SEEN_WORDS];
    int16_t cases[MAX_ONEOFS];
    if (mp->seen_words) memset(seen, 0, sizeof(uint64_t) * (size_t)mp->seen_words);
    for (int32_t k = 0; k < mp->noneofs; k++) cases[k] = -1;
    size_t base = c->nents;
    int rc;
    while (p < end) {
        uint32_t num, wt;
        if ((rc = next_tag_in(c, &p, end, &num, &wt, mp->nfields == 0))) return rc;
        int32_t fi = field_index(mp, num);
        if (fi < 0) {
            if ((rc = skip_value(c, &p, end, wt, num, level))) return rc;
            if (keep) c->unknown = 1;
            continue;
        }
        const Field *f = &mp->fields[fi];
        if (wt != f->wt) {
            if (wt == 2 && f->packable) {
                WVal v = {0, NULL, 0};
                if ((rc = read_value(c, &p, end, 2, &v))) return rc;
                if ((rc = packed(c, f, v.p, v.p + v.n, slot, keep))) return rc;
                continue;
            }
            /* a known number with another wire type: upb keeps it as an unknown field */
            if ((rc = skip_value(c, &p, end, wt, num, level))) return rc;
            if (keep) c->unknown = 1;
            continue;
        }
        WVal v = {0, NULL, 0};
        if ((rc = read_value(c, &p, end, (int)wt, &v))) return rc;
        if (f->shape == S_MAP) {
            if ((rc = map_entry(c, mp, fi, v.p, v.p + v.n, level, keep))) return rc;
            continue;
        }
        if (f->vt == VT_MESSAGE) {
            const uint8_t *vend = v.p + v.n;
            if (f->shape == S_REPEATED) {
                if (f->col < 0) {
                    rc = decode_msg(c, &pl->msgs[f->tsub], v.p, vend, -1, level + 1, keep);
                } else {
                    int32_t item;
                    int64_t s = list_append(c, f->col, slot, &item);
                    if (s < 0) return E_NOMEM;
                    rc = put_message(c, f, item, s, v.p, vend, level, keep);
                }
                if (rc) return rc;
                continue;
            }
            if (f->seen >= 0) {
                uint64_t bit = 1ULL << (f->seen & 63);
                if ((seen[f->seen >> 6] & bit) && keep)
                    return escape(c, "a message field occurs twice (merged)");
                seen[f->seen >> 6] |= bit;
            }
            if (f->oneof >= 0 && (rc = oneof_set(c, mp, cases, f, fi, slot, keep))) return rc;
            if ((rc = put_message(c, f, f->col, slot, v.p, vend, level, keep))) return rc;
            continue;
        }
        if ((rc = check_string(c, f, f->col, &v))) return rc;
        if (f->vt == VT_ENUM && (f->flags & F_CLOSED) &&
            enum_index(&pl->enums[f->enum_id], (int32_t)(uint32_t)v.u) < 0) {
            if (keep) c->unknown = 1; /* upb: a closed enum's unknown number is an unknown field */
            continue;
        }
        if (f->shape == S_REPEATED) {
            if (f->col >= 0) {
                int32_t item;
                int64_t s = list_append(c, f->col, slot, &item);
                if (s < 0) return E_NOMEM;
                if ((rc = store_scalar(c, f->name, f->vt, item, s, &v, 0))) return rc;
            }
            continue;
        }
        if (f->seen >= 0) seen[f->seen >> 6] |= 1ULL << (f->seen & 63);
        if (f->oneof >= 0 && (rc = oneof_set(c, mp, cases, f, fi, slot, keep))) return rc;
        if (f->col >= 0 && (rc = store_scalar(c, f->name, f->vt, f->col, slot, &v, 1))) return rc;
    }
    if (c->nents > base && (rc = maps_finish(c, mp, base, slot, level))) return rc;
    if (keep && mp->nrequired) check_required(c, mp, seen);
    for (int32_t k = 0; k < mp->nu64; k++) { /* a negative int64 is a uint64 past INTEGER's range */
        const Field *f = &mp->fields[mp->u64[k]];
        ColBuf *b = &c->cb[f->col];
        int64_t x = ((int64_t *)b->slots)[slot];
        if (x < 0 && (!pl->cols[f->col].nullable || b->valid[slot])) too_big(c, f->name, (uint64_t)x);
    }
    return OK;
}

/* ---------------------------------------------------------------- the batch */

static void ctx_free(Ctx *c) {
    if (!c) return;
    if (c->cb) {
        for (int32_t k = 0; k < c->plan->ncols; k++) {
            free(c->cb[k].slots);
            free(c->cb[k].valid);
            free(c->cb[k].data);
        }
    }
    free(c->cb);
    free(c->gb);
    free(c->ents);
    free(c->chunks);
    for (size_t k = 0; k < c->nfail; k++) free(c->fail_msgs[k]);
    free(c->fail_rows);
    free(c->fail_kinds);
    free(c->fail_msgs);
    free(c->unknown_rows);
    free(c->escape_rows);
    free(c->snap_groups);
    free(c->snap_vars);
    free(c->var_cols);
    Py_XDECREF((PyObject *)c->plan);
    free(c);
}

static int add_failure(Ctx *c, int64_t row, int kind, const char *text) {
    size_t cap = c->capfail;
    if (grow((void **)&c->fail_rows, &cap, c->nfail + 1, sizeof(int64_t))) return E_NOMEM;
    cap = c->capfail;
    if (grow((void **)&c->fail_kinds, &cap, c->nfail + 1, 1)) return E_NOMEM;
    cap = c->capfail;
    if (grow((void **)&c->fail_msgs, &cap, c->nfail + 1, sizeof(char *))) return E_NOMEM;
    c->capfail = cap;
    char *copy = strdup(text);
    if (!copy) return E_NOMEM;
    c->fail_rows[c->nfail] = row;
    c->fail_kinds[c->nfail] = (uint8_t)kind;
    c->fail_msgs[c->nfail] = copy;
    c->nfail++;
    return OK;
}

static int add_row(int64_t **rows, size_t *n, size_t *cap, int64_t row) {
    if (grow((void **)rows, cap, *n + 1, sizeof(int64_t))) return E_NOMEM;
    (*rows)[(*n)++] = row;
    return OK;
}

static void snapshot(Ctx *c) {
    PlanObject *pl = c->plan;
    for (int32_t g = 1; g < pl->ngroups; g++) c->snap_groups[g] = c->gb[g].n;
    for (int32_t k = 0; k < pl->nvar; k++) c->snap_vars[k] = c->cb[c->var_cols[k]].dlen;
    c->snap_chunks = c->nchunks;
}

static void zero_slots(Ctx *c, int32_t col, int64_t from, int64_t to) {
    const ColPlan *cp = &c->plan->cols[col];
    ColBuf *b = &c->cb[col];
    if (to <= from) return;
    if (cp->esize) memset(b->slots + (size_t)(from + cp->offsets) * cp->esize, 0, (size_t)(to - from) * cp->esize);
    if (cp->nullable) memset(b->valid + from, 0, (size_t)(to - from));
}

/* Undo everything row `row` wrote: its root slot and every item it added to lists. */
static void rollback(Ctx *c, int64_t row) {
    PlanObject *pl = c->plan;
    for (int32_t g = 0; g < pl->ngroups; g++) {
        const GroupPlan *gp = &pl->groups[g];
        int64_t from = g ? c->snap_groups[g] : row, to = g ? c->gb[g].n : row + 1;
        for (int32_t k = 0; k < gp->ncols; k++) zero_slots(c, gp->cols[k], from, to);
        if (g) c->gb[g].n = from;
    }
    for (int32_t k = 0; k < pl->nvar; k++) c->cb[c->var_cols[k]].dlen = c->snap_vars[k];
    c->nchunks = c->snap_chunks;
    c->nents = 0;
}

/* A zig-zag varint of at most 10 bytes as a signed 64-bit value, bits past 64 dropped (registry/confluent.py
 * _read_zigzag). 0 when it does not end within 10 bytes or before `n`. */
static int frame_varint(const uint8_t *d, size_t n, size_t *pos, int64_t *out) {
    uint64_t value = 0;
    for (int shift = 0; shift < 64 && *pos < n; shift += 7) {
        uint8_t b = d[(*pos)++];
        value |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(value >> 1) ^ -(int64_t)(value & 1);
            return 1;
        }
    }
    return 0;
}

#define SHOWN_INDEXES 8 /* registry/confluent.py SHOWN_INDEXES */

/* What shown_indexes writes at most: `[`, SHOWN_INDEXES indexes of up to 20 characters (INT64_MIN, which a
 * hostile frame's varints can spell) each after `, ` but the first, `, ...`, `]` and the NUL. */
#define SHOWN_INDEXES_SIZE (1 + SHOWN_INDEXES * 22 - 2 + 5 + 1 + 1)

/* `[1, 0]`, cut after SHOWN_INDEXES with `, ...` (confluent.py shown_indexes); `out` holds SHOWN_INDEXES_SIZE. */
static void shown_indexes(char *out, const int64_t *idx, int64_t n) {
    size_t at = 0;
    out[at++] = '[';
    for (int64_t k = 0; k < n && k < SHOWN_INDEXES; k++)
        at += (size_t)snprintf(out + at, SHOWN_INDEXES_SIZE - at, k ? ", %lld" : "%lld", (long long)idx[k]);
    if (n > SHOWN_INDEXES) at += (size_t)snprintf(out + at, SHOWN_INDEXES_SIZE - at, ", ...");
    out[at++] = ']';
    out[at] = 0;
}

/* The row's frame is refused: its DESERIALIZATION_ERROR is recorded. E_PARSE, or E_NOMEM. */
static int64_t frame_refused(Ctx *c, const char *why) {
    int rc = add_failure(c, c->row, FAIL_DESERIALIZATION, why);
    return rc ? rc : E_PARSE;
}

/* Confluent's frame (registry/confluent.py frame_payload, messages included): magic byte 0, 4-byte schema
 * id, then a zig-zag count of message indexes and the indexes, which must be the plan's `frame_path`.
 * Returns the payload's offset, or what frame_refused returns. */
static int64_t frame_payload(Ctx *c, const uint8_t *d, size_t n) {
    const PlanObject *pl = c->plan;
    if (n < 6 || d[0] != 0) {
        return frame_refused(c, "not in Confluent's wire format (magic byte 0, schema id, message indexes)");
    }
    uint32_t schema_id = (uint32_t)d[1] << 24 | (uint32_t)d[2] << 16 | (uint32_t)d[3] << 8 | d[4];
    size_t pos = 5;
    int64_t count;
    if (!frame_varint(d, n, &pos, &count)) return frame_refused(c, "truncated or overlong message-index varint");
    /* [0] in one byte is the common case; the indexes are only kept while they could still match */
    int64_t zero = 0, kept[SHOWN_INDEXES];
    const int64_t *got = &zero;
    int64_t ngot = 1;
    int same;
    if (count == 0) {
        same = pl->frame_depth == 1 && pl->frame_path[0] == 0;
    } else {
        if (count < 0 || (uint64_t)count > n - pos) {
            snprintf(c->why, sizeof c->why, "message index count %lld does not fit a %zu-byte message",
                     (long long)count, n);
            return frame_refused(c, c->why);
        }
        same = count == pl->frame_depth;
        for (int64_t k = 0; k < count; k++) {
            int64_t index;
            if (!frame_varint(d, n, &pos, &index)) return frame_refused(c, "truncated or overlong message-index varint");
            if (k < SHOWN_INDEXES) kept[k] = index;
            if (same && index != pl->frame_path[k]) same = 0;
        }
        got = kept;
        ngot = count;
    }
    if (same) return (int64_t)pos;
    char named[SHOWN_INDEXES_SIZE], expected[SHOWN_INDEXES_SIZE];
    shown_indexes(named, got, ngot);
    shown_indexes(expected, pl->frame_path, pl->frame_depth);
    const char *fmt = "written as another message type: its Confluent frame names message indexes %s (schema id %u), "
                      "the configured class %s is %s";
    const char *name = pl->msgs[pl->root_msg].name;
    /* the class name has no bound: the message is sized for it, never cut (it must equal the reference's) */
    int len = snprintf(NULL, 0, fmt, named, schema_id, name, expected);
    char *text = malloc((size_t)len + 1);
    if (!text) return E_NOMEM;
    snprintf(text, (size_t)len + 1, fmt, named, schema_id, name, expected);
    int64_t rc = frame_refused(c, text);
    free(text);
    return rc;
}

static int decode_rows(Ctx *c, int64_t n, int64_t offset, const uint8_t *validity, const void *offsets, int large,
                       const uint8_t *data, uint64_t data_len) {
    PlanObject *pl = c->plan;
    const MsgPlan *root = &pl->msgs[pl->root_msg];
    int32_t root_col = pl->root_col;
    int rc;
    for (int64_t i = 0; i < n; i++) {
        int64_t j = i + offset;
        if (validity && !(validity[j >> 3] & (1 << (j & 7)))) continue;
        uint64_t start, stop;
        if (large) {
            start = (uint64_t)((const int64_t *)offsets)[j];
            stop = (uint64_t)((const int64_t *)offsets)[j + 1];
        } else {
            start = (uint64_t)(uint32_t)((const int32_t *)offsets)[j];
            stop = (uint64_t)(uint32_t)((const int32_t *)offsets)[j + 1];
        }
        if (start > stop || stop > data_len) {
            PyErr_SetString(PyExc_ValueError, "the values array's offsets are out of bounds");
            return E_PARSE;
        }
        const uint8_t *p = data + start, *end = data + stop;
        c->row = i;
        c->why[0] = c->bad[0] = 0;
        if (pl->framed) {
            int64_t at = frame_payload(c, p, (size_t)(end - p));
            if (at == E_NOMEM) return E_NOMEM;
            if (at < 0) continue; /* refused: its failure is recorded */
            p += at;
        }
        snapshot(c);
        c->unknown = c->invalid = c->required = 0;
        c->nents = 0;
        rc = decode_msg(c, root, p, end, i, 0, 1);
        if (rc == E_NOMEM || rc == E_OVERFLOW) return rc;
        if (rc == E_PARSE || rc == E_ESCAPE) {
            rollback(c, i);
            if (rc == E_ESCAPE) {
                if (add_row(&c->escape_rows, &c->nescape, &c->capescape, i)) return E_NOMEM;
                continue;
            }
            char text[600];
            snprintf(text, sizeof text, "not a valid %s: %s", root->name, c->why);
            if ((rc = add_failure(c, i, FAIL_DESERIALIZATION, text))) return rc;
            continue;
        }
        if (c->required) { /* the reference checks these before looking for unknown fields */
            rollback(c, i);
            if ((rc = add_failure(c, i, FAIL_INVALID, c->bad))) return rc;
            continue;
        }
        if (c->unknown && pl->detect_unknown &&
            add_row(&c->unknown_rows, &c->nunknown, &c->capunknown, i))
            return E_NOMEM;
        if (c->invalid) {
            rollback(c, i);
            if ((rc = add_failure(c, i, FAIL_INVALID, c->bad))) return rc;
            continue;
        }
        c->cb[root_col].valid[i] = 1;
    }
    return OK;
}

/* ---------------------------------------------------------------- export (Arrow C data interface) */

typedef struct {
    void *bufs[3];
    const void *ptrs[3];
    struct ArrowArray *kids;
    struct ArrowArray **kidptrs;
    int64_t nkids;
} ArrPriv;

static void arr_release(struct ArrowArray *a) {
    if (!a->release) return;
    ArrPriv *pv = a->private_data;
    if (pv) {
        for (int64_t k = 0; k < pv->nkids; k++)
            if (pv->kids[k].release) pv->kids[k].release(&pv->kids[k]);
        for (int k = 0; k < 3; k++) free(pv->bufs[k]);
        free(pv->kids);
        free(pv->kidptrs);
        free(pv);
    }
    a->release = NULL;
}

/* Packs one-byte-per-slot flags into a bitmap; returns NULL (no buffer) when every slot is set. */
static int pack_bits(const uint8_t *bytes, int64_t n, uint8_t **out, int64_t *zeros, int want_zeros_only_buffer) {
    *out = NULL;
    *zeros = 0;
    uint8_t *bits = calloc((size_t)(n / 8 + 1), 1);
    if (!bits) return E_NOMEM;
    int64_t z = 0;
    for (int64_t i = 0; i < n; i++) {
        if (bytes[i]) bits[i >> 3] |= (uint8_t)(1 << (i & 7));
        else z++;
    }
    *zeros = z;
    if (!z && !want_zeros_only_buffer) {
        free(bits);
        return OK;
    }
    *out = bits;
    return OK;
}

static const char *enum_name(const EnumPlan *e, int32_t number, char *tmp, uint32_t *len) {
    int k = enum_index(e, number);
    if (k >= 0) {
        *len = e->name_lens[k];
        return e->names[k];
    }
    *len = (uint32_t)snprintf(tmp, 16, "%d", number); /* an open enum's unknown number: its decimal text */
    return tmp;
}

static int export_col(Ctx *c, int32_t col, struct ArrowArray *a, PyObject *texts) {
    PlanObject *pl = c->plan;
    const ColPlan *cp = &pl->cols[col];
    ColBuf *b = &c->cb[col];
    int64_t n = c->gb[cp->group].n;
    ArrPriv *pv = calloc(1, sizeof(ArrPriv));
    if (!pv) return E_NOMEM;
    memset(a, 0, sizeof *a);
    a->private_data = pv;
    a->release = arr_release;
    a->length = n;
    a->buffers = pv->ptrs;
    int rc;
    int64_t nulls = 0;
    if (cp->nullable) {
        uint8_t *bits;
        if ((rc = pack_bits(b->valid ? b->valid : (const uint8_t *)"", b->valid ? n : 0, &bits, &nulls, 0))) return rc;
        pv->bufs[0] = bits;
    }
    a->null_count = nulls;
    switch (cp->kind) {
    case C_STRUCT: case C_LIST: {
        int64_t nk = cp->kind == C_LIST ? 1 : cp->nchildren;
        a->n_buffers = cp->kind == C_LIST ? 2 : 1;
        if (cp->kind == C_LIST) {
            int32_t *off = (int32_t *)b->slots;
            if (!off && !(off = calloc(1, 4))) return E_NOMEM;
            b->slots = NULL;
            for (int64_t i = 0; i < n; i++) off[i + 1] += off[i];
            pv->bufs[1] = off;
        }
        pv->kids = calloc((size_t)(nk ? nk : 1), sizeof(struct ArrowArray));
        pv->kidptrs = calloc((size_t)(nk ? nk : 1), sizeof(struct ArrowArray *));
        if (!pv->kids || !pv->kidptrs) return E_NOMEM;
        pv->nkids = nk;
        a->n_children = nk;
        a->children = pv->kidptrs;
        for (int64_t k = 0; k < nk; k++) {
            pv->kidptrs[k] = &pv->kids[k];
            if ((rc = export_col(c, cp->children[k], &pv->kids[k], texts))) return rc;
        }
        break;
    }
    case C_BOOL: {
        uint8_t *bits;
        int64_t zeros;
        if ((rc = pack_bits(b->slots ? b->slots : (const uint8_t *)"", b->slots ? n : 0, &bits, &zeros, 1))) return rc;
        pv->bufs[1] = bits;
        a->n_buffers = 2;
        break;
    }
    case C_I32: case C_I64: case C_F64: case C_DEC:
        if (!b->slots && !(b->slots = calloc(1, 16))) return E_NOMEM;
        pv->bufs[1] = b->slots;
        b->slots = NULL;
        a->n_buffers = 2;
        break;
    case C_VAR: {
        int32_t *off = (int32_t *)b->slots;
        if (!off && !(off = calloc(1, 4))) return E_NOMEM;
        b->slots = NULL;
        for (int64_t i = 0; i < n; i++) off[i + 1] += off[i];
        pv->bufs[1] = off;
        if (!b->data && !(b->data = malloc(1))) return E_NOMEM;
        pv->bufs[2] = b->data;
        b->data = NULL;
        a->n_buffers = 3;
        break;
    }
    case C_ENUM: case C_CUT: case C_U64TXT: {
        int32_t *off = calloc((size_t)n + 1, 4);
        if (!off) return E_NOMEM;
        pv->bufs[1] = off;
        a->n_buffers = 3;
        size_t len = 0, cap = 0;
        uint8_t *data = NULL;
        const EnumPlan *ep = cp->kind == C_ENUM ? &pl->enums[cp->enum_id] : NULL;
        for (int64_t i = 0; i < n; i++) {
            const char *s = NULL;
            uint32_t sl = 0;
            char tmp[24];
            if (!cp->nullable || b->valid[i]) {
                if (ep) {
                    s = enum_name(ep, ((int32_t *)b->slots)[i] ^ cp->enum_default, tmp, &sl);
                } else if (cp->kind == C_U64TXT) {
                    sl = (uint32_t)snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)((uint64_t *)b->slots)[i]);
                    s = tmp;
                } else {
                    uint32_t idx = ((uint32_t *)b->slots)[i];
                    PyObject *t = idx && texts ? PyList_GET_ITEM(texts, idx - 1) : Py_None;
                    if (PyBytes_Check(t)) {
                        s = PyBytes_AS_STRING(t);
                        sl = (uint32_t)PyBytes_GET_SIZE(t);
                    }
                }
            }
            if (len + sl > (size_t)INT32_MAX) {
                free(data);
                return E_OVERFLOW;
            }
            if (grow((void **)&data, &cap, len + sl + 1, 1)) {
                free(data);
                return E_NOMEM;
            }
            if (sl) memcpy(data + len, s, sl);
            len += sl;
            off[i + 1] = (int32_t)len;
        }
        if (!data && !(data = malloc(1))) return E_NOMEM;
        pv->bufs[2] = data;
        break;
    }
    default:
        break;
    }
    for (int k = 0; k < 3; k++) pv->ptrs[k] = pv->bufs[k];
    return OK;
}

/* ---------------------------------------------------------------- Python: Batch */

static void Batch_dealloc(BatchObject *self) {
    ctx_free(self->c);
    if (self->exported) {
        if (self->exported->release) self->exported->release(self->exported);
        free(self->exported);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *rows_list(const int64_t *rows, size_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    if (!out) return NULL;
    for (size_t k = 0; k < n; k++) {
        PyObject *v = PyLong_FromLongLong(rows[k]);
        if (!v) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)k, v);
    }
    return out;
}

static PyObject *Batch_results(BatchObject *self, PyObject *Py_UNUSED(ignored)) {
    Ctx *c = self->c;
    if (!c) {
        PyErr_SetString(PyExc_RuntimeError, "the batch was exported already");
        return NULL;
    }
    PyObject *failures = PyList_New((Py_ssize_t)c->nfail);
    if (!failures) return NULL;
    for (size_t k = 0; k < c->nfail; k++) {
        PyObject *t = Py_BuildValue("(Lis)", (long long)c->fail_rows[k], (int)c->fail_kinds[k], c->fail_msgs[k]);
        if (!t) {
            /* a message that is not UTF-8 cannot happen: every text is ASCII or a descriptor name */
            Py_DECREF(failures);
            return NULL;
        }
        PyList_SET_ITEM(failures, (Py_ssize_t)k, t);
    }
    PyObject *unknown = rows_list(c->unknown_rows, c->nunknown);
    PyObject *escapes = rows_list(c->escape_rows, c->nescape);
    PyObject *cuts = PyList_New((Py_ssize_t)c->nchunks);
    if (!unknown || !escapes || !cuts) goto fail;
    for (size_t k = 0; k < c->nchunks; k++) {
        Chunk *ch = &c->chunks[k];
        PyObject *t = Py_BuildValue("(iLiy#)", ch->col, (long long)ch->row, ch->kind, (const char *)ch->p,
                                    (Py_ssize_t)ch->n);
        if (!t) goto fail;
        PyList_SET_ITEM(cuts, (Py_ssize_t)k, t);
    }
    return Py_BuildValue("(NNNN)", failures, unknown, escapes, cuts);
fail:
    Py_DECREF(failures);
    Py_XDECREF(unknown);
    Py_XDECREF(escapes);
    Py_XDECREF(cuts);
    return NULL;
}

static PyObject *Batch_export(BatchObject *self, PyObject *args) {
    PyObject *texts, *null_rows;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &texts, &PyList_Type, &null_rows)) return NULL;
    Ctx *c = self->c;
    if (!c) {
        PyErr_SetString(PyExc_RuntimeError, "the batch was exported already");
        return NULL;
    }
    if ((size_t)PyList_GET_SIZE(texts) != c->nchunks) {
        PyErr_SetString(PyExc_ValueError, "one text per cut value is needed");
        return NULL;
    }
    int32_t root = c->plan->root_col;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(null_rows); k++) {
        long long row = PyLong_AsLongLong(PyList_GET_ITEM(null_rows, k));
        if (row == -1 && PyErr_Occurred()) return NULL;
        if (row < 0 || row >= c->nrows) {
            PyErr_SetString(PyExc_IndexError, "row out of range");
            return NULL;
        }
        c->cb[root].valid[row] = 0;
    }
    struct ArrowArray *a = calloc(1, sizeof(struct ArrowArray));
    if (!a) return PyErr_NoMemory();
    int rc = export_col(c, root, a, texts);
    if (rc) {
        arr_release(a);
        free(a);
        if (rc == E_OVERFLOW) PyErr_SetString(PyExc_OverflowError, "a column of the batch is over 2 GiB");
        else PyErr_NoMemory();
        return NULL;
    }
    ctx_free(self->c);
    self->c = NULL;
    self->exported = a;
    return PyLong_FromVoidPtr(a);
}

static PyMethodDef Batch_methods[] = {
    {"results", (PyCFunction)Batch_results, METH_NOARGS,
     "(failures [(row, kind, message)], unknown rows, escaped rows, cuts [(column, row, kind, bytes)])"},
    {"export", (PyCFunction)Batch_export, METH_VARARGS,
     "export(texts, null_rows) -> address of the root ArrowArray (valid while the batch lives)"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject BatchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "firehose_bq.decode._native.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)Batch_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The decoded columns of one batch of values, until exported to Arrow.",
    .tp_methods = Batch_methods,
};

/* ---------------------------------------------------------------- Python: Plan */

static void plan_free_contents(PlanObject *pl) {
    free(pl->frame_path);
    if (pl->cols) {
        for (int32_t k = 0; k < pl->ncols; k++) free(pl->cols[k].children);
        free(pl->cols);
    }
    if (pl->groups) {
        for (int32_t k = 0; k < pl->ngroups; k++) free(pl->groups[k].cols);
        free(pl->groups);
    }
    if (pl->msgs) {
        for (int32_t k = 0; k < pl->nmsgs; k++) {
            MsgPlan *m = &pl->msgs[k];
            if (m->fields)
                for (int32_t f = 0; f < m->nfields; f++) free(m->fields[f].name);
            free(m->fields);
            free(m->dense);
            free(m->required);
            free(m->u64);
            free(m->name);
        }
        free(pl->msgs);
    }
    if (pl->enums) {
        for (int32_t k = 0; k < pl->nenums; k++) {
            EnumPlan *e = &pl->enums[k];
            if (e->names)
                for (int32_t i = 0; i < e->n; i++) free(e->names[i]);
            free(e->names);
            free(e->name_lens);
            free(e->numbers);
            free(e->dense);
        }
        free(pl->enums);
    }
}

static void Plan_dealloc(PlanObject *self) {
    plan_free_contents(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static char *copy_str(PyObject *s) {
    Py_ssize_t n;
    const char *u = PyUnicode_AsUTF8AndSize(s, &n);
    if (!u) return NULL;
    char *out = malloc((size_t)n + 1);
    if (!out) {
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(out, u, (size_t)n + 1);
    return out;
}

static int bad_plan(const char *what) {
    PyErr_Format(PyExc_ValueError, "invalid decoder plan: %s", what);
    return -1;
}

static int assign_groups(PlanObject *pl, int32_t col, int32_t group, int32_t *counts, int depth) {
    if (col < 0 || col >= pl->ncols) return bad_plan("column index");
    if (depth > 1000) return bad_plan("column tree too deep");
    ColPlan *cp = &pl->cols[col];
    if (cp->group >= 0) return bad_plan("a column is used twice");
    cp->group = group;
    counts[group]++;
    for (int32_t k = 0; k < cp->nchildren; k++) {
        int32_t g = group;
        if (cp->kind == C_LIST) g = pl->ngroups++;
        if (assign_groups(pl, cp->children[k], g, counts, depth + 1)) return -1;
    }
    return 0;
}

static int parse_columns(PlanObject *pl, PyObject *columns) {
    Py_ssize_t n = PyList_Size(columns);
    if (n < 0) return -1;
    pl->ncols = (int32_t)n;
    pl->cols = calloc((size_t)(n ? n : 1), sizeof(ColPlan));
    if (!pl->cols) return PyErr_NoMemory(), -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        ColPlan *cp = &pl->cols[k];
        int kind, nullable, enum_id, enum_default;
        PyObject *children;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(columns, k), "iiO!ii", &kind, &nullable, &PyTuple_Type, &children,
                              &enum_id, &enum_default))
            return -1;
        if (kind < C_STRUCT || kind > C_U64TXT) return bad_plan("column kind");
        cp->kind = (uint8_t)kind;
        cp->nullable = (uint8_t)(nullable != 0);
        cp->enum_id = enum_id;
        cp->enum_default = enum_default;
        cp->group = -1;
        cp->var_idx = -1;
        cp->nchildren = (int32_t)PyTuple_GET_SIZE(children);
        if (kind == C_LIST ? cp->nchildren != 1 : kind != C_STRUCT && cp->nchildren)
            return bad_plan("children of a column");
        cp->children = calloc((size_t)(cp->nchildren ? cp->nchildren : 1), sizeof(int32_t));
        if (!cp->children) return PyErr_NoMemory(), -1;
        for (int32_t i = 0; i < cp->nchildren; i++) {
            long v = PyLong_AsLong(PyTuple_GET_ITEM(children, i));
            if (v == -1 && PyErr_Occurred()) return -1;
            if (v < 0 || v >= n) return bad_plan("child column index");
            cp->children[i] = (int32_t)v;
        }
        switch (kind) {
        case C_STRUCT: cp->esize = 0; break;
        case C_LIST: case C_VAR: cp->esize = 4; cp->offsets = 1; break;
        case C_BOOL: cp->esize = 1; break;
        case C_I32: case C_ENUM: case C_CUT: cp->esize = 4; break;
        case C_I64: case C_F64: case C_U64TXT: cp->esize = 8; break;
        case C_DEC: cp->esize = 16; break;
        }
        if (kind == C_VAR) cp->var_idx = pl->nvar++;
    }
    return 0;
}

static int parse_enums(PlanObject *pl, PyObject *enums) {
    Py_ssize_t n = PyList_Size(enums);
    if (n < 0) return -1;
    pl->nenums = (int32_t)n;
    pl->enums = calloc((size_t)(n ? n : 1), sizeof(EnumPlan));
    if (!pl->enums) return PyErr_NoMemory(), -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        EnumPlan *e = &pl->enums[k];
        int closed;
        PyObject *numbers, *names;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(enums, k), "iO!O!", &closed, &PyTuple_Type, &numbers, &PyTuple_Type, &names))
            return -1;
        Py_ssize_t m = PyTuple_GET_SIZE(numbers);
        if (m != PyTuple_GET_SIZE(names)) return bad_plan("enum names");
        e->closed = closed;
        e->n = (int32_t)m;
        e->numbers = calloc((size_t)(m ? m : 1), sizeof(int32_t));
        e->names = calloc((size_t)(m ? m : 1), sizeof(char *));
        e->name_lens = calloc((size_t)(m ? m : 1), sizeof(uint32_t));
        if (!e->numbers || !e->names || !e->name_lens) return PyErr_NoMemory(), -1;
        for (Py_ssize_t i = 0; i < m; i++) {
            long v = PyLong_AsLong(PyTuple_GET_ITEM(numbers, i));
            if (v == -1 && PyErr_Occurred()) return -1;
            if (v < INT32_MIN || v > INT32_MAX || (i && v <= e->numbers[i - 1])) return bad_plan("enum numbers");
            e->numbers[i] = (int32_t)v;
            if (!(e->names[i] = copy_str(PyTuple_GET_ITEM(names, i)))) return -1;
            e->name_lens[i] = (uint32_t)strlen(e->names[i]);
        }
        if (m) {
            e->min = e->numbers[0];
            e->max = e->numbers[m - 1];
            if ((int64_t)e->max - e->min < 4096) {
                e->dense = calloc((size_t)((int64_t)e->max - e->min + 1), sizeof(int32_t));
                if (!e->dense) return PyErr_NoMemory(), -1;
                for (int32_t i = 0; i < e->n; i++) e->dense[(int64_t)e->numbers[i] - e->min] = i + 1;
            }
        }
    }
    return 0;
}

static int parse_messages(PlanObject *pl, PyObject *messages) {
    Py_ssize_t n = PyList_Size(messages);
    if (n < 0) return -1;
    pl->nmsgs = (int32_t)n;
    pl->msgs = calloc((size_t)(n ? n : 1), sizeof(MsgPlan));
    if (!pl->msgs) return PyErr_NoMemory(), -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        MsgPlan *m = &pl->msgs[k];
        PyObject *name, *fields;
        int noneofs;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(messages, k), "UO!i", &name, &PyList_Type, &fields, &noneofs)) return -1;
        if (!(m->name = copy_str(name))) return -1;
        if (noneofs < 0 || noneofs > MAX_ONEOFS) return bad_plan("too many oneofs");
        m->noneofs = noneofs;
        Py_ssize_t nf = PyList_GET_SIZE(fields);
        m->nfields = (int32_t)nf;
        m->fields = calloc((size_t)(nf ? nf : 1), sizeof(Field));
        m->required = calloc((size_t)(nf ? nf : 1), sizeof(int32_t));
        m->u64 = calloc((size_t)(nf ? nf : 1), sizeof(int32_t));
        if (!m->fields || !m->required || !m->u64) return PyErr_NoMemory(), -1;
        uint32_t maxnum = 0;
        int32_t nseen = 0;
        for (Py_ssize_t i = 0; i < nf; i++) {
            Field *f = &m->fields[i];
            unsigned long number;
            int vt, kind, shape, flags, aux_vt, oneof, col, sub, tsub, enum_id;
            PyObject *fname;
            if (!PyArg_ParseTuple(PyList_GET_ITEM(fields, i), "kiiiiiiiiiiU", &number, &vt, &kind, &shape, &flags,
                                  &aux_vt, &oneof, &col, &sub, &tsub, &enum_id, &fname))
                return -1;
            if (number == 0 || number > 536870911UL || (i && number <= m->fields[i - 1].number))
                return bad_plan("field numbers must be valid and ascending");
            if (vt < VT_INT32 || vt > VT_MESSAGE || kind < K_SCALAR || kind > K_MSG || shape < S_SINGULAR || shape > S_MAP)
                return bad_plan("field type");
            if (oneof >= noneofs || col >= pl->ncols || sub >= n || tsub >= n || enum_id >= pl->nenums)
                return bad_plan("field reference");
            if (vt == VT_MESSAGE && (tsub < 0 || (sub < 0 && (kind == K_RECORD || shape == S_MAP))))
                return bad_plan("message field without a plan");
            if (vt == VT_ENUM && enum_id < 0) return bad_plan("enum field without an enum");
            if (kind == K_WRAPPER && (aux_vt < VT_INT32 || aux_vt > VT_BYTES)) return bad_plan("wrapper type");
            f->number = (uint32_t)number;
            f->vt = (uint8_t)vt;
            f->kind = (uint8_t)kind;
            f->shape = (uint8_t)shape;
            f->flags = (uint8_t)flags;
            f->aux_vt = (uint8_t)aux_vt;
            f->oneof = (int16_t)oneof;
            f->col = col;
            f->sub = sub;
            f->tsub = tsub;
            f->enum_id = enum_id;
            f->wt = (uint8_t)wire_type(vt);
            f->packable = shape == S_REPEATED && f->wt != 2;
            f->seen = -1;
            if ((shape == S_SINGULAR && vt == VT_MESSAGE) || (flags & F_REQUIRED)) f->seen = nseen++;
            if (flags & F_REQUIRED) m->required[m->nrequired++] = (int32_t)i;
            if (shape == S_SINGULAR && kind == K_SCALAR && is_unsigned64(vt) && col >= 0 && pl->cols[col].kind == C_I64)
                m->u64[m->nu64++] = (int32_t)i;
            if (shape == S_MAP) m->has_maps = 1;
            if (!(f->name = copy_str(fname))) return -1;
            if (number > maxnum) maxnum = (uint32_t)number;
        }
        if (nseen > MAX_SEEN_WORDS * 64) return bad_plan("too many message and required fields in one message");
        m->seen_words = (nseen + 63) / 64;
        m->ndense = maxnum + 1 < DENSE_LIMIT ? maxnum + 1 : DENSE_LIMIT;
        m->dense = calloc(m->ndense, sizeof(int32_t));
        if (!m->dense) return PyErr_NoMemory(), -1;
        for (int32_t i = 0; i < m->nfields; i++)
            if (m->fields[i].number < m->ndense) m->dense[m->fields[i].number] = i + 1;
    }
    /* map fields point at entry plans of exactly two fields, key (1) and value (2) */
    for (int32_t k = 0; k < pl->nmsgs; k++) {
        for (int32_t i = 0; i < pl->msgs[k].nfields; i++) {
            Field *f = &pl->msgs[k].fields[i];
            if (f->shape == S_MAP) {
                if (f->sub < 0) return bad_plan("map without an entry plan");
                MsgPlan *ep = &pl->msgs[f->sub];
                if (ep->nfields != 2 || ep->fields[0].number != 1 || ep->fields[1].number != 2 ||
                    ep->fields[0].vt == VT_MESSAGE || ep->fields[1].shape != S_SINGULAR)
                    return bad_plan("map entry plan");
                if (f->col >= 0 && (pl->cols[f->col].kind != C_LIST)) return bad_plan("map column");
            }
            if (f->shape == S_REPEATED && f->col >= 0 && pl->cols[f->col].kind != C_LIST) return bad_plan("list column");
        }
    }
    return 0;
}

/* `framed`: the tuple of message indexes frames must name (None: values are not framed). */
static int parse_frame_path(PlanObject *pl, PyObject *path) {
    if (!PyTuple_Check(path) || PyTuple_GET_SIZE(path) < 1 || PyTuple_GET_SIZE(path) > 1000)
        return bad_plan("framed: a tuple of message indexes, or None");
    pl->frame_depth = (int32_t)PyTuple_GET_SIZE(path);
    pl->frame_path = calloc((size_t)pl->frame_depth, sizeof(int64_t));
    if (!pl->frame_path) {
        PyErr_NoMemory();
        return -1;
    }
    for (int32_t k = 0; k < pl->frame_depth; k++) {
        long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(path, k));
        if (v == -1 && PyErr_Occurred()) return -1;
        pl->frame_path[k] = v;
    }
    return 0;
}

static PyObject *Plan_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"columns", "enums", "messages", "root_message", "root_column", "struct_plan",
                             "value_plan", "list_plan", "framed", "detect_unknown", NULL};
    PyObject *columns, *enums, *messages, *framed;
    int root_msg, root_col, struct_plan, value_plan, list_plan, detect;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!O!iiiiiOp", kwlist, &PyList_Type, &columns, &PyList_Type,
                                     &enums, &PyList_Type, &messages, &root_msg, &root_col, &struct_plan, &value_plan,
                                     &list_plan, &framed, &detect))
        return NULL;
    PlanObject *pl = (PlanObject *)type->tp_alloc(type, 0);
    if (!pl) return NULL;
    if (parse_columns(pl, columns) || parse_enums(pl, enums) || parse_messages(pl, messages)) goto fail;
    if (root_msg < 0 || root_msg >= pl->nmsgs || root_col < 0 || root_col >= pl->ncols ||
        pl->cols[root_col].kind != C_STRUCT || !pl->cols[root_col].nullable || struct_plan >= pl->nmsgs ||
        value_plan >= pl->nmsgs || list_plan >= pl->nmsgs) {
        bad_plan("roots");
        goto fail;
    }
    pl->root_msg = root_msg;
    pl->root_col = root_col;
    pl->struct_plan = struct_plan;
    pl->value_plan = value_plan;
    pl->list_plan = list_plan;
    pl->framed = framed != Py_None;
    if (pl->framed && parse_frame_path(pl, framed)) goto fail;
    pl->detect_unknown = detect;
    for (int32_t k = 0; k < pl->ncols; k++)
        if (pl->cols[k].enum_id >= pl->nenums || (pl->cols[k].kind == C_ENUM && pl->cols[k].enum_id < 0)) {
            bad_plan("enum column");
            goto fail;
        }
    {
        int32_t *counts = calloc((size_t)pl->ncols + 1, sizeof(int32_t));
        if (!counts) {
            PyErr_NoMemory();
            goto fail;
        }
        pl->ngroups = 1;
        if (assign_groups(pl, root_col, 0, counts, 0)) {
            free(counts);
            goto fail;
        }
        pl->groups = calloc((size_t)pl->ngroups, sizeof(GroupPlan));
        if (!pl->groups) {
            free(counts);
            PyErr_NoMemory();
            goto fail;
        }
        for (int32_t g = 0; g < pl->ngroups; g++) {
            pl->groups[g].cols = calloc((size_t)(counts[g] ? counts[g] : 1), sizeof(int32_t));
            if (!pl->groups[g].cols) {
                free(counts);
                PyErr_NoMemory();
                goto fail;
            }
        }
        free(counts);
        for (int32_t k = 0; k < pl->ncols; k++) {
            if (pl->cols[k].group < 0) {
                bad_plan("a column outside the root's tree");
                goto fail;
            }
            GroupPlan *gp = &pl->groups[pl->cols[k].group];
            gp->cols[gp->ncols++] = k;
        }
    }
    /* every field writing a column writes one of the kind its value needs */
    for (int32_t k = 0; k < pl->nmsgs; k++) {
        for (int32_t i = 0; i < pl->msgs[k].nfields; i++) {
            Field *f = &pl->msgs[k].fields[i];
            if (f->col < 0 || f->shape == S_MAP) continue;
            int32_t col = f->col;
            if (f->shape == S_REPEATED) col = pl->cols[col].children[0];
            int ck = pl->cols[col].kind, vt = f->kind == K_WRAPPER ? f->aux_vt : f->vt, good;
            switch (f->kind) {
            case K_SCALAR: case K_WRAPPER:
                good = vt == VT_ENUM ? ck == C_ENUM : vt == VT_BOOL ? ck == C_BOOL
                     : (vt == VT_FLOAT || vt == VT_DOUBLE) ? ck == C_F64 : (vt == VT_STRING || vt == VT_BYTES) ? ck == C_VAR
                     : is_unsigned64(vt) ? (ck == C_I64 || ck == C_DEC || ck == C_U64TXT) : ck == C_I64;
                break;
            case K_RECORD: good = ck == C_STRUCT; break;
            case K_TIMESTAMP: good = ck == C_I64; break;
            case K_DURATION:
                good = ck == C_STRUCT && pl->cols[col].nchildren == 2 && pl->cols[pl->cols[col].children[0]].kind == C_I64 &&
                       pl->cols[pl->cols[col].children[1]].kind == C_I64;
                break;
            case K_DATE: good = ck == C_I32; break;
            case K_STRUCT: case K_VALUE: case K_LIST: good = ck == C_VAR; break;
            case K_CUT: good = ck == C_CUT; break;
            default: good = 0;
            }
            if (!good) {
                bad_plan("a field's column does not fit its value");
                goto fail;
            }
            if ((f->kind == K_STRUCT || f->kind == K_VALUE || f->kind == K_LIST) &&
                (pl->struct_plan < 0 || pl->value_plan < 0 || pl->list_plan < 0)) {
                bad_plan("JSON fields need the Struct, Value and ListValue plans");
                goto fail;
            }
        }
    }
    return (PyObject *)pl;
fail:
    Py_DECREF(pl);
    return NULL;
}

static PyObject *Plan_decode(PlanObject *self, PyObject *args) {
    long long n, offset;
    unsigned long long validity_addr, offsets_addr, data_addr, data_len;
    int large;
    if (!PyArg_ParseTuple(args, "LLKKKKp", &n, &offset, &validity_addr, &offsets_addr, &data_addr, &data_len, &large))
        return NULL;
    if (n < 0 || offset < 0 || (n && !offsets_addr)) {
        PyErr_SetString(PyExc_ValueError, "bad values array");
        return NULL;
    }
    Ctx *c = calloc(1, sizeof(Ctx));
    if (!c) return PyErr_NoMemory();
    c->plan = self;
    Py_INCREF(self);
    c->nrows = n;
    c->cb = calloc((size_t)self->ncols, sizeof(ColBuf));
    c->gb = calloc((size_t)self->ngroups, sizeof(GroupBuf));
    c->snap_groups = calloc((size_t)self->ngroups, sizeof(int64_t));
    c->snap_vars = calloc((size_t)(self->nvar ? self->nvar : 1), sizeof(size_t));
    c->var_cols = calloc((size_t)(self->nvar ? self->nvar : 1), sizeof(int32_t));
    BatchObject *bt = NULL;
    int rc = E_NOMEM;
    if (!c->cb || !c->gb || !c->snap_groups || !c->snap_vars || !c->var_cols) goto done;
    for (int32_t k = 0; k < self->ncols; k++)
        if (self->cols[k].var_idx >= 0) c->var_cols[self->cols[k].var_idx] = k;
    if ((rc = group_grow(c, 0, n ? n : 1))) goto done;
    c->gb[0].n = n;
    rc = decode_rows(c, n, offset, (const uint8_t *)(uintptr_t)validity_addr, (const void *)(uintptr_t)offsets_addr,
                     large, (const uint8_t *)(uintptr_t)data_addr, data_len);
    if (rc) goto done;
    bt = PyObject_New(BatchObject, &BatchType);
    if (!bt) goto done;
    bt->c = c;
    bt->exported = NULL;
    return (PyObject *)bt;
done:
    ctx_free(c);
    if (!PyErr_Occurred()) {
        if (rc == E_OVERFLOW) PyErr_SetString(PyExc_OverflowError, "a column of the batch is over 2 GiB");
        else PyErr_NoMemory();
    }
    return NULL;
}

static PyMethodDef Plan_methods[] = {
    {"decode", (PyCFunction)Plan_decode, METH_VARARGS,
     "decode(length, offset, validity_address, offsets_address, data_address, data_length, large) -> Batch"},
    {NULL, NULL, 0, NULL}};

static PyTypeObject PlanType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "firehose_bq.decode._native.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A compiled decoder plan (see native.py); immutable.",
    .tp_methods = Plan_methods,
    .tp_new = Plan_new,
};

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_native",
    .m_doc = "Protobuf wire bytes -> Arrow buffers (see _native.c).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&PlanType) < 0 || PyType_Ready(&BatchType) < 0) return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (!m) return NULL;
    Py_INCREF(&PlanType);
    if (PyModule_AddObject(m, "Plan", (PyObject *)&PlanType) < 0) {
        Py_DECREF(&PlanType);
        Py_DECREF(m);
        return NULL;
    }
#define CONST(name) if (PyModule_AddIntConstant(m, #name, name) < 0) goto fail
    CONST(VT_INT32); CONST(VT_INT64); CONST(VT_UINT32); CONST(VT_UINT64); CONST(VT_SINT32); CONST(VT_SINT64);
    CONST(VT_BOOL); CONST(VT_ENUM); CONST(VT_FIXED32); CONST(VT_SFIXED32); CONST(VT_FLOAT); CONST(VT_FIXED64);
    CONST(VT_SFIXED64); CONST(VT_DOUBLE); CONST(VT_STRING); CONST(VT_BYTES); CONST(VT_MESSAGE);
    CONST(K_SCALAR); CONST(K_RECORD); CONST(K_TIMESTAMP); CONST(K_DURATION); CONST(K_DATE); CONST(K_WRAPPER);
    CONST(K_STRUCT); CONST(K_VALUE); CONST(K_LIST); CONST(K_CUT); CONST(K_MSG);
    CONST(S_SINGULAR); CONST(S_REPEATED); CONST(S_MAP);
    CONST(F_UTF8); CONST(F_CLOSED); CONST(F_REQUIRED); CONST(F_AUX_UTF8);
    CONST(C_STRUCT); CONST(C_LIST); CONST(C_BOOL); CONST(C_I32); CONST(C_I64); CONST(C_F64); CONST(C_DEC);
    CONST(C_VAR); CONST(C_ENUM); CONST(C_CUT); CONST(C_U64TXT);
    CONST(FAIL_DESERIALIZATION); CONST(FAIL_INVALID); CONST(CUT_MESSAGE); CONST(CUT_ENTRY); CONST(MAX_LEVEL);
#undef CONST
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
