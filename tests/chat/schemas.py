"""Twenty JSON schemas of the kinds replies are asked for: nested objects, arrays, enums,
numbers, required and optional fields; no bound on strings or numbers unless the schema has one
(the constraint closes a reply within its budget). Shared by the runtime and server tests."""

from __future__ import annotations

STRING = {"type": "string"}
SCHEMAS = {
    "flat": {"type": "object", "properties": {"name": STRING, "age": {"type": "integer"}},
             "required": ["name", "age"]},
    "optional_fields": {"type": "object", "properties": {"a": STRING, "b": {"type": "number"}},
                        "required": ["a"]},
    "enum": {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
             "required": ["unit"], "additionalProperties": False},
    "string_enum": {"type": "string", "enum": ["red", "green", "blue"]},
    "number": {"type": "number"},
    "bounded_integer": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1,
                                                               "maximum": 10}}, "required": ["n"]},
    "boolean_null": {"type": "object", "properties": {"ok": {"type": "boolean"},
                                                      "note": {"type": ["string", "null"]}},
                     "required": ["ok", "note"], "additionalProperties": False},
    "array_of_numbers": {"type": "array", "items": {"type": "number"}, "maxItems": 5},
    "array_of_strings": {"type": "object", "properties": {"tags": {"type": "array", "items": STRING,
                                                                   "minItems": 1}},
                         "required": ["tags"]},
    "nested": {"type": "object", "properties": {
        "user": {"type": "object", "properties": {"id": {"type": "integer"}, "email": STRING},
                 "required": ["id", "email"], "additionalProperties": False}},
        "required": ["user"], "additionalProperties": False},
    "deeply_nested": {"type": "object", "properties": {"a": {"type": "object", "properties": {
        "b": {"type": "object", "properties": {"c": {"type": "array", "items": {"type": "integer"}}},
              "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    "array_of_objects": {"type": "array", "maxItems": 3, "items": {
        "type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"], "additionalProperties": False}},
    "weather_call": {"type": "object", "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": STRING, "days": {"type": "integer",
                                                                                "minimum": 1}},
                      "required": ["city"]}}, "required": ["name", "arguments"],
        "additionalProperties": False},
    "string_lengths": {"type": "object", "properties": {"code": {"type": "string", "minLength": 3,
                                                                 "maxLength": 5}},
                       "required": ["code"]},
    "pattern": {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["zip"]},
    "any_of": {"anyOf": [{"type": "object", "properties": {"cat": STRING}, "required": ["cat"]},
                         {"type": "object", "properties": {"dog": {"type": "integer"}},
                          "required": ["dog"]}]},
    "number_bounds": {"type": "object", "properties": {"p": {"type": "number", "minimum": 0,
                                                             "maximum": 1}}, "required": ["p"]},
    "ref": {"$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}},
                                "required": ["x"]}},
            "type": "object", "properties": {"start": {"$ref": "#/$defs/point"},
                                             "end": {"$ref": "#/$defs/point"}},
            "required": ["start", "end"]},
    "tuple": {"type": "array", "prefixItems": [STRING, {"type": "integer"}], "items": False,
              "minItems": 2},
    "recipe": {"type": "object", "properties": {
        "title": STRING, "servings": {"type": "integer", "minimum": 1},
        "ingredients": {"type": "array", "maxItems": 4, "items": {
            "type": "object", "properties": {"item": STRING, "grams": {"type": "number"}},
            "required": ["item"]}},
        "vegan": {"type": "boolean"}}, "required": ["title", "ingredients", "vegan"]},
}
assert len(SCHEMAS) >= 20


def json_schema_format(name: str) -> dict:
    """OpenAI's response_format for the schema ``name``."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": SCHEMAS[name]}}


#: Schemas people have that llguidance refuses unless read leniently (JSONSchemaBench's kinds):
#: a format it does not know, and oneOf.
LENIENT_SCHEMAS = {
    "url_format": ({"type": "object", "properties": {"home": {"type": "string", "format": "url"},
                                                     "age": {"type": "integer"}},
                    "required": ["home", "age"], "additionalProperties": False}, "Unknown format"),
    "one_of": ({"type": "object", "properties": {"code": {"oneOf": [
        {"type": "string", "maxLength": 3}, {"type": "string", "minLength": 5}]}},
                "required": ["code"], "additionalProperties": False}, "oneOf"),
}

#: A dozen required keys: the shortest reply takes 80 tokens of this small tokenizer.
DOZEN = ["name", "city", "zip", "age", "tel", "mail", "note", "tag", "day", "sum", "tax", "ref"]
DOZEN_SCHEMA = {"type": "object", "properties": {k: STRING for k in DOZEN}, "required": DOZEN,
                "additionalProperties": False}
