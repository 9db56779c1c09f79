"""The publishing workflow and CI call the same Make targets a developer runs."""

from __future__ import annotations

import re

import yaml

from tests.notebooks.notebook_files import ROOT


def workflow_commands() -> list[str]:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "book.yml").read_text())
    return [step["run"] for job in workflow["jobs"].values() for step in job.get("steps", []) if "run" in step]


def test_workflow_runs_make_test_and_publishes_the_built_book():
    commands = workflow_commands()
    assert "make test" in commands, commands
    text = (ROOT / ".github" / "workflows" / "book.yml").read_text()
    assert "actions/deploy-pages" in text and "path: _build/html" in text


def test_makefile_test_target_builds_the_book():
    makefile = (ROOT / "Makefile").read_text()
    test_recipe = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "$(MAKE) book" in test_recipe, test_recipe


def test_ci_script_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make book" in readme


def test_readme_shows_the_site_with_a_committed_screenshot():
    import re

    readme = (ROOT / "README.md").read_text()
    images = re.findall(r"!\[([^\]]+)\]\(([^)]+\.png)\)", readme)
    assert images, "the README shows no screenshot of the site"
    for alt, path in images:
        assert alt.strip(), f"README image {path} has no alt text"
        assert (ROOT / path).stat().st_size > 20_000, f"README image {path} is missing or empty"


def test_readme_badges_show_this_repository_build_and_open_a_lesson_in_colab(repository_url):
    readme = (ROOT / "README.md").read_text()
    badges = dict((image, link) for image, link in re.findall(r"\[!\[[^\]]+\]\(([^)]+)\)\]\(([^)]+)\)", readme))
    workflow = f"{repository_url}/actions/workflows/book.yml"
    assert badges.get(f"{workflow}/badge.svg?branch=main") == workflow, (
        f"the README has no build badge for {workflow}; its badges are {badges}"
    )
    assert (ROOT / ".github" / "workflows" / "book.yml").exists()
    colab = [link for image, link in badges.items() if image.endswith("colab-badge.svg")]
    github_path = repository_url.removeprefix("https://github.com/")
    prefix = f"https://colab.research.google.com/github/{github_path}/blob/main/"
    assert len(colab) == 1 and colab[0].startswith(prefix), f"the Colab badge must open a notebook under {prefix}"
    assert (ROOT / colab[0].removeprefix(prefix)).exists(), f"the Colab badge opens a missing notebook: {colab[0]}"
