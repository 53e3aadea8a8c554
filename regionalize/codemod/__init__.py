"""The codemod: one file's source in, its rewrite and its sites out (`transform`, which runs the finders of
`patterns` over what the lower modules read). `transform_source` is its public entry point."""

from regionalize.codemod.transform import might_have_sites, transform_source

__all__ = ["might_have_sites", "transform_source"]
