"""MkDocs entry point for the project's hooks; the code lives in tools/infralens_docs/hooks.py."""

from infralens_docs.hooks import (
    on_build_error,
    on_config,
    on_env,
    on_files,
    on_nav,
    on_page_content,
    on_page_markdown,
    on_post_build,
    on_post_page,
    on_pre_page,
    on_serve,
    on_shutdown,
    on_startup,
)

__all__ = [
    "on_build_error",
    "on_config",
    "on_env",
    "on_files",
    "on_nav",
    "on_page_content",
    "on_page_markdown",
    "on_post_build",
    "on_post_page",
    "on_pre_page",
    "on_serve",
    "on_shutdown",
    "on_startup",
]
