"""The dialects the PostgreSQL backend compiles its statements with, one per driver
(psycopg 3, psycopg2, asyncpg: each has its own placeholder style and bind casts), all with
every built-in the SQL names resolved in ``pg_catalog`` whatever the session's ``search_path``.

PostgreSQL resolves unqualified function names, operators and type names through the
session's ``search_path``. When ``pg_catalog`` is not first in it (``attacker,pg_catalog``),
or an earlier schema holds a better match for the argument types, an object created by
anyone who can write to that schema runs instead of the built-in, with the privileges of
the role running the statement. Table names are already schema-qualified; this compiler
qualifies the rest, in one place, so no statement can forget it:

- functions: ``pg_catalog.date_part(...)``, ``pg_catalog.count(*)``, ... (``coalesce``,
  ``greatest``, ``least`` and ``nullif`` are SQL syntax, not functions, and stay as they are);
- operators: ``a OPERATOR(pg_catalog.=) b``. Every ``OPERATOR()`` has the same precedence,
  so an operator expression nested in another is parenthesized; ``x IN (SELECT ...)``
  becomes the equivalent ``x OPERATOR(pg_catalog.=) ANY (SELECT ...)``; any other
  keyword operator (LIKE, BETWEEN, IS DISTINCT FROM, an IN list) resolves ``=`` or ``~~``
  through the search path with no way to qualify it, so it fails to compile instead;
- types: names that are not SQL keywords (``text``, ``jsonb``) are written
  ``pg_catalog.text``; keyword types (``INTEGER``, ``BIGINT``, ``VARCHAR``, ``DOUBLE
  PRECISION``) always mean the built-in.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import exc
from sqlalchemy.dialects.postgresql.asyncpg import PGCompiler_asyncpg, PGDialect_asyncpg
from sqlalchemy.dialects.postgresql.base import PGCompiler, PGTypeCompiler
from sqlalchemy.dialects.postgresql.psycopg import PGCompiler_psycopg, PGDialect_psycopg
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
from sqlalchemy.engine import Dialect
from sqlalchemy.sql import elements, operators, selectable

CATALOG = "pg_catalog"
# SQL constructs that look like function calls but are grammar: never schema-qualified
_SYNTAX_FUNCTIONS = frozenset({"coalesce", "greatest", "least", "nullif"})
_SYMBOLS = {
    operators.eq: "=", operators.ne: "<>", operators.lt: "<", operators.le: "<=",
    operators.gt: ">", operators.ge: ">=", operators.add: "+", operators.sub: "-",
    operators.mul: "*",
}
# IN (subquery) is = ANY (subquery); NOT IN (subquery) is <> ALL (subquery)
_IN = {operators.in_op: "=) ANY", operators.not_in_op: "<>) ALL"}
_KEEP = frozenset({operators.is_, operators.is_not})  # IS [NOT] NULL: no operator lookup
_SYMBOLIC = re.compile(r"[-+*/<>=~!@#%^&|`?]+")
# set while compiling the direct operands of a qualified operator: they are parenthesized
_OPERAND = "_alkstore_operand"


def _symbol(op: Any) -> str | None:
    """The operator's symbol when it is one PostgreSQL looks up by name."""
    if isinstance(op, operators.custom_op):
        return op.opstring if _SYMBOLIC.fullmatch(op.opstring) else None
    return _SYMBOLS.get(op)


class CatalogCompilerMixin(PGCompiler):
    """A PostgreSQL statement compiler resolving every built-in in ``pg_catalog``: mixed
    into each driver's compiler, so every placeholder style gets the same qualification."""

    def visit_function(self, func: Any, add_to_result_map: Any = None, **kw: Any) -> str:
        kw.pop(_OPERAND, None)  # the argument list brackets its own operands
        text = super().visit_function(func, add_to_result_map=add_to_result_map, **kw)
        name = func.name.lower()
        if func.packagenames or name in _SYNTAX_FUNCTIONS or not text.lower().startswith(name + "("):
            return text  # already qualified, SQL syntax, or a keyword (CURRENT_TIMESTAMP)
        return f"{CATALOG}.{text}"

    def visit_binary(self, binary: Any, override_operator: Any = None, *args: Any, **kw: Any) -> Any:
        op = override_operator or binary.operator
        if op in _IN:
            if not isinstance(binary.right, (elements.Grouping, selectable.ScalarSelect, selectable.SelectBase)):
                raise exc.CompileError("an IN list cannot be schema-qualified: compare with = ANY (array)")
        elif op not in _KEEP and _symbol(op) is None:
            raise exc.CompileError(f"{getattr(op, '__name__', op)} resolves an operator through search_path and cannot be qualified")
        return super().visit_binary(binary, override_operator, *args, **kw)

    def _generate_generic_binary(self, binary: Any, opstring: str, eager_grouping: bool = False, **kw: Any) -> str:
        nested = kw.pop(_OPERAND, False)
        if binary.operator in _IN:
            opstring = f" OPERATOR({CATALOG}.{_IN[binary.operator]} "
        elif (symbol := _symbol(binary.operator)) is not None:
            opstring = f" OPERATOR({CATALOG}.{symbol}) "
        else:  # IS [NOT]: binds looser than any OPERATOR() operand
            return super()._generate_generic_binary(binary, opstring, eager_grouping=eager_grouping, **kw)
        text = super()._generate_generic_binary(binary, opstring, eager_grouping=False, **{**kw, _OPERAND: True})
        # every OPERATOR() binds alike (left to right): keep the expression tree's shape
        return f"({text})" if nested else text

    def visit_expression_clauselist(self, clauselist: Any, **kw: Any) -> str:
        """``a + b + c`` (SQLAlchemy flattens chains of one operator into a list)."""
        symbol = _SYMBOLS.get(clauselist.operator)
        if symbol is None:
            return super().visit_expression_clauselist(clauselist, **kw)
        nested = kw.pop(_OPERAND, False)
        kw.update({_OPERAND: True, "_in_operator_expression": True})
        text = f" OPERATOR({CATALOG}.{symbol}) ".join(c._compiler_dispatch(self, **kw) for c in clauselist.clauses)
        return f"({text})" if nested else text

    def _generate_generic_unary_operator(self, unary: Any, opstring: str, **kw: Any) -> str:
        op = opstring.strip()
        if _SYMBOLIC.fullmatch(op):
            kw[_OPERAND] = True
            return f"OPERATOR({CATALOG}.{op}) " + unary.element._compiler_dispatch(self, **kw)
        kw.pop(_OPERAND, None)
        return super()._generate_generic_unary_operator(unary, opstring, **kw)

    # constructs that bracket what they contain: an operand flag does not reach inside
    def visit_grouping(self, grouping: Any, asfrom: bool = False, **kw: Any) -> str:
        kw.pop(_OPERAND, None)
        return super().visit_grouping(grouping, asfrom=asfrom, **kw)

    def visit_select(self, *args: Any, **kw: Any) -> str:
        kw.pop(_OPERAND, None)
        if kw.get("insert_into"):
            # an INSERT's SELECT is never a FROM item: inside a CTE SQLAlchemy would still
            # label every column ("gone.id AS id"), bytes the claim cannot spare (psycopg
            # caches its parse of statements up to 4 KiB)
            kw["asfrom"] = False
        return super().visit_select(*args, **kw)

    def visit_cte(self, *args: Any, **kw: Any) -> Any:
        kw.pop(_OPERAND, None)
        return super().visit_cte(*args, **kw)

    def visit_case(self, clause: Any, **kw: Any) -> str:
        kw.pop(_OPERAND, None)
        return super().visit_case(clause, **kw)


class CatalogTypeCompiler(PGTypeCompiler):
    """Type names that are not SQL keywords are resolved in ``pg_catalog``."""

    def visit_TEXT(self, type_: Any, **kw: Any) -> str:
        text = super().visit_TEXT(type_, **kw)  # TEXT, with any COLLATE clause after it
        return f"{CATALOG}.text{text[len('TEXT'):]}"

    def visit_JSONB(self, type_: Any, **kw: Any) -> str:
        return f"{CATALOG}.jsonb"


class CatalogCompiler(CatalogCompilerMixin, PGCompiler_psycopg):
    """psycopg 3's compiler (``%(name)s``, bind casts), resolving built-ins in pg_catalog."""


class CatalogCompiler_psycopg2(CatalogCompilerMixin, PGCompiler):
    """psycopg2's compiler (``%(name)s``, no bind casts), resolving built-ins in pg_catalog."""


class CatalogCompiler_asyncpg(CatalogCompilerMixin, PGCompiler_asyncpg):
    """asyncpg's compiler (``$1`` positional, bind casts), resolving built-ins in pg_catalog."""


class CatalogDialect(PGDialect_psycopg):
    """psycopg 3's dialect with the compilers above (used to compile, never to connect)."""

    statement_compiler = CatalogCompiler
    type_compiler_cls = CatalogTypeCompiler


class CatalogDialect_psycopg2(PGDialect_psycopg2):
    """psycopg2's dialect with the compilers above (used to compile, never to connect)."""

    statement_compiler = CatalogCompiler_psycopg2
    type_compiler_cls = CatalogTypeCompiler


class CatalogDialect_asyncpg(PGDialect_asyncpg):
    """asyncpg's dialect with the compilers above (used to compile, never to connect)."""

    statement_compiler = CatalogCompiler_asyncpg
    type_compiler_cls = CatalogTypeCompiler


# the compile dialect of each driver the backend runs statements through
CATALOG_DIALECTS: dict[str, type[Dialect]] = {
    "psycopg": CatalogDialect,
    "psycopg2": CatalogDialect_psycopg2,
    "asyncpg": CatalogDialect_asyncpg,
}
_DRIVER_BASES: tuple[tuple[type[Dialect], str], ...] = (
    (PGDialect_psycopg, "psycopg"),  # and its async variant: the same SQL
    (PGDialect_psycopg2, "psycopg2"),  # and its subclasses (psycopg2cffi)
    (PGDialect_asyncpg, "asyncpg"),
)
_driver_by_class: dict[type[Dialect], str | None] = {}


def driver_of_dialect(dialect: Dialect) -> str | None:
    """Which compile dialect serves a caller's SQLAlchemy dialect (None: no supported one).
    Remembered per dialect class: this is on the path of every transactional call."""
    cls = type(dialect)
    try:
        return _driver_by_class[cls]
    except KeyError:
        driver = next((name for base, name in _DRIVER_BASES if issubclass(cls, base)), None)
        _driver_by_class[cls] = driver
        return driver
