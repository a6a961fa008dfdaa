"""Substitutions, as Cloud Build applies them to a build: the built-ins, the user's `_KEY`s, `$$`,
dynamic substitutions' bash-style expansions, and Cloud Build's own refusals. Pure functions.

Where each rule comes from:
- Google's "Substitute variable values" page (cloud.google.com/build/docs/configuring-builds/
  substitute-variable-values): PROJECT_ID, BUILD_ID, PROJECT_NUMBER and LOCATION in every build;
  TRIGGER_NAME, COMMIT_SHA, REVISION_ID, SHORT_SHA (the first seven characters of COMMIT_SHA),
  REPO_NAME, REPO_FULL_NAME, BRANCH_NAME, TAG_NAME, REF_NAME, TRIGGER_BUILD_CONFIG_PATH,
  SERVICE_ACCOUNT_EMAIL and SERVICE_ACCOUNT only in builds a trigger starts; "if a default
  substitution is not available (such as with sourceless builds, or with builds that use storage
  source), then occurrences of the missing variable are replaced with an empty string"; a user key
  begins with an underscore and holds uppercase letters, digits and underscores; `$$` is a literal
  `$`; with `options.dynamicSubstitutions` a value may use other substitutions and bash parameter
  expansions, and a build a trigger starts always has dynamic substitutions and ALLOW_LOOSE;
- GoogleCloudPlatform/cloud-build-local (archived; Google's own reading of the same rules),
  subst/subst.go (what a `$KEY` / `${KEY}` parameter is, `$$`) and validate/validate.go (the
  errors, word for word: "key in the template %q is not matched in the substitution data",
  "key %q in the substitution data is not matched in the template", "key in the template %q is not
  a valid built-in substitution", "substitution key %q does not respect format %q and is not an
  overridable built-in substitutions"; the first two are errors unless
  `options.substitutionOption: ALLOW_LOOSE`; which built-ins `--substitutions` may override);
- the expansions dynamic substitutions take: `${VAR:-default}` (nested, as in
  `${A:-${B}}`) and `${VAR//find/replace}` from a build gcloud ran (cloud-build-local#118),
  `${VAR:offset}` from kubernetes/cloud-provider-openstack's cloudbuild.yaml; `:offset:length`,
  `#`, `##`, `%`, `%%` and `/` are bash's own, with bash's meaning. Anything else in braces is
  refused with one line, not guessed;
- only a plain `$KEY` or `${KEY}` counts as a use of KEY: a build whose user keys appeared only
  as `${_KEY:-default}` in its steps was refused with "key ... in the substitution data is not
  matched in the template" (datacommonsorg/website#6392). A plain reference inside another
  substitution's value counts, when dynamic substitutions expand it (the rehearsal's reading:
  the pages do not say it; cloudbuild.yaml's `_REGION` is used only in `_REGISTRY`'s default).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from typing import Mapping

# Every build gets these ("Substitute variable values").
EVERY_BUILD = ("PROJECT_ID", "BUILD_ID", "PROJECT_NUMBER", "LOCATION")
# Only a build a trigger starts gets these; a manual build has them empty unless given.
TRIGGER_ONLY = ("TRIGGER_NAME", "COMMIT_SHA", "REVISION_ID", "SHORT_SHA", "REPO_NAME", "REPO_FULL_NAME",
                "BRANCH_NAME", "TAG_NAME", "REF_NAME", "TRIGGER_BUILD_CONFIG_PATH", "SERVICE_ACCOUNT_EMAIL",
                "SERVICE_ACCOUNT")
BUILT_INS = EVERY_BUILD + TRIGGER_ONLY
# What `--substitutions` may set besides `_KEY`s (cloud-build-local validate.go's overridable
# built-ins, and the trigger-only values the manual builds give by hand).
OVERRIDABLE = frozenset(TRIGGER_ONLY)
USER_KEY = re.compile(r"^_[A-Z0-9_]+$")
USER_KEY_FORMAT = "^_[A-Z0-9_]+$"
SHORT_SHA_LENGTH = 7
_NAME = r"[A-Z_][A-Z0-9_]*"
_PLAIN = re.compile(rf"\$(?:\{{({_NAME})\}}|({_NAME}))")


class SubstitutionError(ValueError):
    """Cloud Build refuses the build; str() is one line."""


@dataclasses.dataclass(frozen=True)
class Reference:
    """One `$...` in a template: its span, and what it is."""

    start: int
    end: int  # exclusive
    key: str | None  # the variable; None for `$$`
    expression: str | None = None  # what follows the name inside braces, for a bash-style expansion


def parse_flag(text: str) -> dict[str, str]:
    """`--substitutions=KEY=VALUE,KEY=VALUE` as gcloud reads it (an ArgDict), with gcloud's
    `^DELIM^` prefix for values that hold commas (`gcloud topic escaping`)."""
    delimiter = ","
    if text.startswith("^") and text.find("^", 1) > 1:
        end = text.index("^", 1)
        delimiter, text = text[1:end], text[end + 1:]
    values: dict[str, str] = {}
    for item in text.split(delimiter) if text else []:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise SubstitutionError(f"--substitutions: expected KEY=VALUE, got {item!r}")
        values[key] = value
    return values


def references(template: str) -> list[Reference]:
    """Every parameter of a template, in order: `$$`, `$KEY`, `${KEY}`, and `${KEY...}` with an
    expansion after the name (its closing brace matched across nested braces)."""
    found, i = [], 0
    while i < len(template):
        if template[i] != "$":
            i += 1
            continue
        if template.startswith("$$", i):
            found.append(Reference(i, i + 2, None))
            i += 2
            continue
        plain = _PLAIN.match(template, i)
        if plain:
            found.append(Reference(i, plain.end(), plain.group(1) or plain.group(2)))
            i = plain.end()
            continue
        braced = re.compile(rf"\$\{{({_NAME})").match(template, i)
        if braced:
            close = _closing_brace(template, braced.end())
            if close is not None:
                found.append(Reference(i, close + 1, braced.group(1), template[braced.end():close]))
                i = close + 1
                continue
        i += 1
    return found


def _closing_brace(text: str, start: int) -> int | None:
    depth = 1
    for index in range(start, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def plain_keys(template: str) -> set[str]:
    """The keys a template uses: its plain `$KEY` and `${KEY}` references."""
    return {r.key for r in references(template) if r.key is not None and r.expression is None}


def expression_keys(template: str) -> set[str]:
    """The keys a template reads through bash-style expansions (not uses, for the unused-key check)."""
    keys = set()
    for reference in references(template):
        if reference.expression is not None:
            keys.add(reference.key)
            keys |= expression_keys(reference.expression)
    return keys


def expand(template: str, values: Mapping[str, str], dynamic: bool) -> str:
    """The template with every parameter replaced; a key `values` lacks is the empty string."""
    out, last = [], 0
    for reference in references(template):
        out.append(template[last:reference.start])
        if reference.key is None:
            out.append("$")
        elif reference.expression is None:
            out.append(values.get(reference.key, ""))
        elif dynamic:
            out.append(_bash(reference.key, reference.expression, values))
        else:
            # Without dynamic substitutions Cloud Build leaves what it cannot read as it is.
            out.append(template[reference.start:reference.end])
        last = reference.end
    out.append(template[last:])
    return "".join(out)


def _bash(key: str, expression: str, values: Mapping[str, str]) -> str:
    value = values.get(key, "")
    shown = f"${{{key}{expression}}}"
    if expression.startswith(":-"):
        return value if value else expand(expression[2:], values, True)
    match = re.fullmatch(r":\s*(-?\d+)(?::\s*(-?\d+))?", expression)
    if match:
        offset = int(match.group(1))
        start = max(len(value) + offset, 0) if offset < 0 else offset
        if match.group(2) is None:
            return value[start:]
        length = int(match.group(2))
        end = len(value) + length if length < 0 else start + length
        if end < start:
            raise SubstitutionError(f"{shown}: substring expression < 0")
        return value[start:end]
    for operator, from_start, longest in (("##", True, True), ("#", True, False), ("%%", False, True),
                                          ("%", False, False)):
        if expression.startswith(operator):
            return _remove(value, expand(expression[len(operator):], values, True), from_start, longest)
    if expression.startswith("/"):
        every = expression.startswith("//")
        pattern, _, replacement = expression[2 if every else 1:].partition("/")
        return _replace(value, expand(pattern, values, True), expand(replacement, values, True), every)
    raise SubstitutionError(f"{shown}: not a bash expansion the rehearsal knows Cloud Build to take "
                            "(:-, :offset[:length], #, ##, %, %%, /, //)")


def _remove(value: str, pattern: str, from_start: bool, longest: bool) -> str:
    lengths = range(len(value), -1, -1) if longest else range(len(value) + 1)
    for length in lengths:
        part = value[:length] if from_start else value[len(value) - length:]
        if fnmatch.fnmatchcase(part, pattern):
            return value[length:] if from_start else value[:len(value) - length]
    return value


def _replace(value: str, pattern: str, replacement: str, every: bool) -> str:
    if not pattern:
        return value
    out, i, replaced = [], 0, False
    while i < len(value):
        match = None
        if every or not replaced:
            for end in range(len(value), i, -1):  # bash replaces the longest match
                if fnmatch.fnmatchcase(value[i:end], pattern):
                    match = end
                    break
        if match is None:
            out.append(value[i])
            i += 1
        else:
            out.append(replacement)
            i, replaced = match, True
    return "".join(out)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """Every substitution's final value, and what Cloud Build would have said of the build."""

    values: dict[str, str]
    warnings: tuple[str, ...]  # what ALLOW_LOOSE let through


def built_ins(*, project_id: str, build_id: str, project_number: str, location: str,
              trigger: Mapping[str, str] | None = None) -> dict[str, str]:
    """The built-in substitutions of a build: every build's, then a trigger's (empty for a manual build)."""
    values = {"PROJECT_ID": project_id, "BUILD_ID": build_id, "PROJECT_NUMBER": project_number, "LOCATION": location}
    values.update({key: "" for key in TRIGGER_ONLY})
    values.update(trigger or {})
    if values["COMMIT_SHA"] and not (trigger or {}).get("SHORT_SHA"):
        values["SHORT_SHA"] = values["COMMIT_SHA"][:SHORT_SHA_LENGTH]
    if values["COMMIT_SHA"] and not (trigger or {}).get("REVISION_ID"):
        values["REVISION_ID"] = values["COMMIT_SHA"]
    return values


def check_given(given: Mapping[str, str]) -> None:
    """A key `--substitutions` may not set, refused as Cloud Build refuses it."""
    for key in given:
        if not USER_KEY.match(key) and key not in OVERRIDABLE:
            raise SubstitutionError(f"substitution key {key!r} does not respect format {USER_KEY_FORMAT!r} "
                                    "and is not an overridable built-in substitutions")


def resolve(templates: list[str], defaults: Mapping[str, str], given: Mapping[str, str],
            built: Mapping[str, str], *, dynamic: bool, loose: bool) -> Resolved:
    """Every value, after checking the build as Cloud Build does. `templates` are the build's fields
    that take substitutions; `defaults` the config's `substitutions:`; `given` `--substitutions`
    (or a trigger's). Raises SubstitutionError, one line, where Cloud Build refuses the build."""
    check_given(given)
    for key in defaults:
        if not USER_KEY.match(key) and key not in OVERRIDABLE:
            raise SubstitutionError(f"substitution key {key!r} does not respect format {USER_KEY_FORMAT!r} "
                                    "and is not an overridable built-in substitutions")
    raw = {**defaults, **given}
    user = {key: value for key, value in raw.items() if USER_KEY.match(key)}
    base = {**built, **{key: value for key, value in raw.items() if key in OVERRIDABLE}}
    if base.get("COMMIT_SHA") and "SHORT_SHA" not in raw and not built.get("SHORT_SHA"):
        base["SHORT_SHA"] = base["COMMIT_SHA"][:SHORT_SHA_LENGTH]
    values = _values(user, base, dynamic)

    # The checks read the templates as written, and the substitution values as dynamic
    # substitutions read them.
    scanned = list(templates) + (list(raw.values()) if dynamic else [])
    used = set().union(*(plain_keys(text) for text in scanned)) if scanned else set()
    problems, errors = [], []
    for text in scanned:
        for key in sorted(plain_keys(text) | (expression_keys(text) if dynamic else set())):
            if key in base or key in user:
                continue
            if USER_KEY.match(key):
                problems.append(f"key in the template {key!r} is not matched in the substitution data; "
                                f"substitutions = {dict(sorted(raw.items()))}")
            else:
                errors.append(f"key in the template {key!r} is not a valid built-in substitution")
    for key in sorted(raw):
        if key not in used and USER_KEY.match(key):
            problems.append(f"key {key!r} in the substitution data is not matched in the template")
    if errors:
        raise SubstitutionError(errors[0])
    problems = list(dict.fromkeys(problems))
    if problems and not loose:
        raise SubstitutionError(";".join(problems))
    return Resolved(values, tuple(problems))


def _values(user: Mapping[str, str], base: Mapping[str, str], dynamic: bool) -> dict[str, str]:
    """Each user key's final value: with dynamic substitutions, expanded against the others
    (a cycle refused); without, as written."""
    if not dynamic:
        return {**base, **user}
    done: dict[str, str] = dict(base)
    visiting: list[str] = []

    def value_of(key: str) -> str:
        if key in done:
            return done[key]
        if key not in user:
            return ""
        if key in visiting:
            raise SubstitutionError(f"substitution {key} refers to itself: {' -> '.join(visiting + [key])}")
        visiting.append(key)
        needed = {k for k in plain_keys(user[key]) | expression_keys(user[key]) if k in user}
        lookup = {**done, **{k: value_of(k) for k in needed}}
        visiting.pop()
        done[key] = expand(user[key], lookup, True)
        return done[key]

    for key in user:
        value_of(key)
    return done
