"""The prediction server: any exported SavedModel with a serving signature, behind Vertex AI's
custom-container contract (docs/serving.md). The prediction image carries this package alone:
it imports nothing of trainer/ or of any example, and learns all it needs about a model from the
SavedModel's signature and from its flags.

The public names, each documented and typed where it is defined; everything else in this
package may change between releases (tests/unit/test_serving_layout.py holds the code to this):

| module            | names                                                                |
|-------------------|----------------------------------------------------------------------|
| serving.server    | main, build_parser, settings_from, Settings, ConfigError; `python -m serving.server` |
| serving.predict   | main, build_parser, answer, PredictError, BATCH; `python -m serving.predict` |
| serving.model     | load, Model, Tensor, ModelError, Refused, DEFAULT_SIGNATURE           |
| serving.instances | parse, instance, Limits, BadRequest                                   |
| serving.answers   | prediction, body                                                      |
| serving.predictor | load, Predictor, RefusedInstance                                      |
"""
