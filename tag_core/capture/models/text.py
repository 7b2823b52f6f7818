"""Attention models: an encoder-decoder Transformer and a BERT-style encoder."""

from __future__ import annotations

from .spec import InputSpec, ModelSpec


def _embed(tokens, vocab: int, seq_len: int, width: int, name: str):
    import keras
    from keras import layers

    positions = keras.ops.arange(seq_len)
    token_vectors = layers.Embedding(vocab, width, name=f"{name}_tokens")(tokens)
    position_vectors = layers.Embedding(seq_len, width, name=f"{name}_positions")(positions)
    return token_vectors + position_vectors


def _feed_forward(x, width: int, hidden: int, name: str):
    from keras import layers

    y = layers.Dense(hidden, activation="gelu", name=f"{name}_ff1")(x)
    y = layers.Dense(width, name=f"{name}_ff2")(y)
    return layers.LayerNormalization(name=f"{name}_ln_ff")(x + y)


def _encoder_block(x, width: int, heads: int, hidden: int, name: str):
    from keras import layers

    attended = layers.MultiHeadAttention(heads, width // heads, name=f"{name}_attention")(x, x)
    x = layers.LayerNormalization(name=f"{name}_ln_attention")(x + attended)
    return _feed_forward(x, width, hidden, name)


def _decoder_block(x, memory, width: int, heads: int, hidden: int, name: str):
    from keras import layers

    attended = layers.MultiHeadAttention(heads, width // heads, name=f"{name}_self_attention")(
        x, x, use_causal_mask=True
    )
    x = layers.LayerNormalization(name=f"{name}_ln_self")(x + attended)
    crossed = layers.MultiHeadAttention(heads, width // heads, name=f"{name}_cross_attention")(x, memory)
    x = layers.LayerNormalization(name=f"{name}_ln_cross")(x + crossed)
    return _feed_forward(x, width, hidden, name)


def transformer(
    layers: int = 6,
    d_model: int = 512,
    heads: int = 8,
    ff: int = 2048,
    vocab: int = 32000,
    seq_len: int = 32,
    batch_size: int = 64,
) -> ModelSpec:
    """The base Transformer of Vaswani et al.: `layers` encoder and `layers` decoder blocks."""

    def build():
        import keras

        source = keras.Input((seq_len,), dtype="int32", name="source")
        target = keras.Input((seq_len,), dtype="int32", name="target")
        memory = _embed(source, vocab, seq_len, d_model, "encoder")
        for i in range(layers):
            memory = _encoder_block(memory, d_model, heads, ff, f"encoder_{i}")
        x = _embed(target, vocab, seq_len, d_model, "decoder")
        for i in range(layers):
            x = _decoder_block(x, memory, d_model, heads, ff, f"decoder_{i}")
        logits = keras.layers.Dense(vocab, name="generator")(x)
        return keras.Model([source, target], logits, name="transformer")

    return ModelSpec(
        name="transformer",
        build=build,
        inputs=[
            InputSpec("source", (seq_len,), "int32", max_value=vocab),
            InputSpec("target", (seq_len,), "int32", max_value=vocab),
        ],
        label=InputSpec("labels", (seq_len,), "int32", max_value=vocab),
        loss=_logits_loss(),
        metrics=["accuracy"],
        batch_size=batch_size,
        options=dict(layers=layers, d_model=d_model, heads=heads, ff=ff, vocab=vocab, seq_len=seq_len),
    )


def bert_base(
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    ff: int = 3072,
    vocab: int = 30522,
    seq_len: int = 128,
    classes: int = 2,
    batch_size: int = 16,
) -> ModelSpec:
    """BERT-base encoder with a sequence-classification head (fine-tuning step)."""

    def build():
        import keras

        tokens = keras.Input((seq_len,), dtype="int32", name="tokens")
        x = keras.layers.LayerNormalization(name="embedding_ln")(_embed(tokens, vocab, seq_len, hidden, "embedding"))
        for i in range(layers):
            x = _encoder_block(x, hidden, heads, ff, f"layer_{i}")
        pooled = keras.layers.Dense(hidden, activation="tanh", name="pooler")(x[:, 0, :])
        logits = keras.layers.Dense(classes, name="classifier")(pooled)
        return keras.Model(tokens, logits, name="bert_base")

    return ModelSpec(
        name="bert_base",
        build=build,
        inputs=[InputSpec("tokens", (seq_len,), "int32", max_value=vocab)],
        label=InputSpec("labels", (), "int32", max_value=classes),
        loss=_logits_loss(),
        metrics=["accuracy"],
        batch_size=batch_size,
        options=dict(layers=layers, hidden=hidden, heads=heads, ff=ff, vocab=vocab, seq_len=seq_len, classes=classes),
    )


def _logits_loss():
    """Sparse categorical cross-entropy over logits, made when the step is traced: a spec that imported Keras
    would load TF (0.6 GB) into processes that only resolve it (`tag capture`, `tag profile`)."""
    def loss(labels, outputs):
        import keras

        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)(labels, outputs)

    return loss
