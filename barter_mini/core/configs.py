"""Model configurations as data (paper Table 4, plus CPU-sized variants).

Every configuration describes the *full-density* model. A compact model of density rho
keeps all ``depth`` layers but only part of the heads and FFN channels (see
:mod:`barter_mini.core.budgets`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace



@dataclass(frozen=True)
class ModelConfig:
    """A full-density vision transformer.

    ``family`` is ``"cct"`` (convolutional tokenizer, sequence pooling, the reference CCT
    layer) or ``"vit"`` (patch embedding, class token, timm's pre-norm ``Block``).
    Heads always have ``head_dim`` channels, so the attention width of a layer is
    ``heads * head_dim`` whatever the embedding dimension.

    ``timm_model`` names a stock timm architecture (``timm.create_model(timm_model,
    **dict(timm_kwargs))``) that this configuration describes instead of the package's own
    ViT (:mod:`barter_mini.core.models.timm_vit`); ``prefix_tokens`` are its class (and
    distillation or register) tokens.
    """

    name: str
    family: str
    img_size: int
    in_chans: int
    num_classes: int
    depth: int
    embed_dim: int
    heads_per_layer: int
    ffn_per_layer: int
    head_dim: int = 16
    # CCT tokenizer: ``conv_layers`` x (conv k x k, stride 1 -> ReLU -> MaxPool(3, 2, 1))
    conv_layers: int = 1
    conv_kernel: int = 3
    conv_channels: int | None = None  # channels between tokenizer convs (default: embed_dim)
    # ViT patch embedding
    patch_size: int = 8
    prefix_tokens: int = 1
    default_dataset: str = "fashion-mnist"
    # a stock timm vision transformer: its architecture name and keyword arguments (pairs)
    timm_model: str | None = None
    timm_kwargs: tuple = ()

    @property
    def num_tokens(self) -> int:
        """Tokens each encoder layer sees (CCT: pooled feature map; ViT: patches + class token)."""
        if self.family == "cct":
            side = self.img_size
            for _ in range(self.conv_layers):
                side = (side - 1) // 2 + 1  # MaxPool(3, stride 2, padding 1)
            return side * side
        return (self.img_size // self.patch_size) ** 2 + self.prefix_tokens

    def for_data(self, img_size: int, in_chans: int, num_classes: int) -> "ModelConfig":
        """The same architecture sized for a dataset's images and classes."""
        sized = {"img_size": img_size, "in_chans": in_chans, "num_classes": num_classes}
        kwargs = tuple({**dict(self.timm_kwargs), **sized}.items()) if self.timm_model else ()
        return replace(self, **sized, timm_kwargs=kwargs)

    @classmethod
    def from_dict(cls, saved: dict) -> "ModelConfig":
        """A configuration saved with ``dataclasses.asdict`` (checkpoints; JSON turns
        the ``timm_kwargs`` pairs into lists)."""
        pairs = tuple((key, _frozen(value)) for key, value in saved.get("timm_kwargs", ()))
        return cls(**{**saved, "timm_kwargs": pairs})


def _frozen(value):
    """Lists (from JSON or asdict) back into tuples, so a configuration stays hashable."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


MODEL_CONFIGS: dict[str, ModelConfig] = {
    # Table 4, CCT on CIFAR-100: 7 layers, embed 256, 16 heads x 16, FFN 512.
    "cct-paper": ModelConfig(
        name="cct-paper", family="cct", img_size=32, in_chans=3, num_classes=100,
        depth=7, embed_dim=256, heads_per_layer=16, ffn_per_layer=512,
        conv_layers=1, default_dataset="cifar100"),
    # Table 4, ViT on Tiny-ImageNet: patch 8 at 64x64, 9 layers, embed 192, 12 heads x 16, FFN 384.
    "vit-paper": ModelConfig(
        name="vit-paper", family="vit", img_size=64, in_chans=3, num_classes=200,
        depth=9, embed_dim=192, heads_per_layer=12, ffn_per_layer=384,
        patch_size=8, default_dataset="tiny-imagenet"),
    # CPU-sized: 28x28 grey images -> 7x7 = 49 tokens (two conv+pool stages, 16 channels
    # between them to keep the tokenizer cheap), 4 layers, 10 heads x 16, FFN 128.
    # Ten heads per layer is the fewest that still leaves every layer a head at rho = 0.1.
    "cct-mini": ModelConfig(
        name="cct-mini", family="cct", img_size=28, in_chans=1, num_classes=10,
        depth=4, embed_dim=64, heads_per_layer=10, ffn_per_layer=128,
        conv_layers=2, conv_channels=16, default_dataset="fashion-mnist"),
    # The next models step from cct-mini toward cct-paper one axis at a time, to map where
    # reallocation pays. Depth: the paper's 7 layers, all else cct-mini's (at rho = 0.1 every
    # layer still has one head, so heads cannot move; FFN channels can).
    "cct-mini-deep": ModelConfig(
        name="cct-mini-deep", family="cct", img_size=28, in_chans=1, num_classes=10,
        depth=7, embed_dim=64, heads_per_layer=10, ffn_per_layer=128,
        conv_layers=2, conv_channels=16, default_dataset="fashion-mnist"),
    # ... and the paper's 16 heads per layer: at rho = 0.1, 11 heads over 7 layers, so some
    # layers hold two and a head can move, as in cct-paper.
    "cct-mini-deep-16h": ModelConfig(
        name="cct-mini-deep-16h", family="cct", img_size=28, in_chans=1, num_classes=10,
        depth=7, embed_dim=64, heads_per_layer=16, ffn_per_layer=128,
        conv_layers=2, conv_channels=16, default_dataset="fashion-mnist"),
    "vit-mini": ModelConfig(
        name="vit-mini", family="vit", img_size=28, in_chans=1, num_classes=10,
        depth=4, embed_dim=64, heads_per_layer=10, ffn_per_layer=128,
        patch_size=4, default_dataset="fashion-mnist"),
}
