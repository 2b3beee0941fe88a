"""The LeJEPA text base model of seed 003: data preparation, span-masked views, the `TextTransformer`
(encoder / predictor / decoder), the LeJEPA losses with SIGReg, training, and the frozen-encoder hook."""
