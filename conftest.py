"""Repository-wide test set-up: nothing that imports a package, so that each package's tests run in
an environment holding that package alone (`hatch run pkg-config:run`, ...). Fixtures that need a
package live beside the tests that use them (tests/conftest.py, packages/trainer/tests/conftest.py)."""
