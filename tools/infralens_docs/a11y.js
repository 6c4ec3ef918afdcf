// The article below the first screen, and the accessibility fixes that need its layout
// (axe-core rules of WCAG 2.2 AA). Inlined by hooks.on_post_page.
//
// - site.css gives each block of the article, and each notebook cell, content-visibility:
//   auto, so while the page loads the browser styles and lays out only the blocks on
//   screen (on the longest pages the rest was most of the main thread's work before the
//   reader could scroll). Once the page has loaded, this lays the other blocks out a few at
//   a time, each slice about 5 ms, so the page answers input throughout; then it marks
//   <html data-settled>. A block laid out keeps its normal rendering (data-shown).
// - A table, an equation, a row of tab labels or a code block wider than its column
//   scrolls sideways; a keyboard reader can scroll it only if it takes focus
//   (scrollable-region-focusable). Each block is checked as it is laid out, the whole page
//   after that and after every change to the page.
// - Each code block's copy button sits in an unnamed <nav>, so a notebook page with forty
//   code cells had forty identical navigation landmarks (landmark-unique); the buttons
//   are not site navigation, so their wrapper gets role="none".
(function () {
  "use strict";
  var root = document.documentElement;
  var BLOCKS = [
    ".md-content__inner > :not([data-shown])",
    ".jp-Notebook > .jp-Cell:not([data-shown])",
  ].join(", ");
  // (before the bundle starts, a code block scrolls on its <code> element and a table
  // on itself: the bundle then makes the code focusable and wraps the tables)
  var WIDE = [
    ".md-typeset__scrollwrap",
    ".math-display",
    ".md-typeset pre",
    ".md-typeset pre > code",
    ".md-typeset table",
    ".md-typeset .tabbed-labels",
  ].join(", ");
  var SLICE_MS = 5;
  var loaded = document.readyState === "complete";
  var running = false;
  var again = false;
  var pending = false;

  function focusable(scope) {
    var wide = Array.prototype.slice.call(scope.querySelectorAll(WIDE));
    if (scope.matches && scope.matches(WIDE)) wide.push(scope);
    wide.forEach(function (el) {
      if (!el.hasAttribute("tabindex") && el.scrollWidth > el.clientWidth + 1) {
        el.setAttribute("tabindex", "0");
      }
    });
  }
  function fix() {
    focusable(document);
    document.querySelectorAll("nav.md-code__nav:not([role])").forEach(function (nav) {
      nav.setAttribute("role", "none");
    });
  }
  var later = window.requestIdleCallback
    ? function (fn) {
        requestIdleCallback(fn, { timeout: 100 });
      }
    : function (fn) {
        setTimeout(fn, 0);
      };
  function settle() {
    running = true;
    var blocks = Array.prototype.slice.call(document.querySelectorAll(BLOCKS));
    function slice() {
      var start = performance.now();
      while (blocks.length && performance.now() - start < SLICE_MS) {
        var block = blocks.shift();
        block.setAttribute("data-shown", "");
        // reading its height lays the block out now, inside this slice, not in the next
        // frame together with every block the slice reached
        if (block.offsetHeight) focusable(block);
      }
      if (blocks.length) return later(slice);
      fix();
      running = false;
      if (again) {
        again = false;
        return schedule();
      }
      root.setAttribute("data-settled", "");
    }
    slice();
  }
  function schedule() {
    root.removeAttribute("data-settled");
    if (!loaded) return;
    if (running) {
      again = true;
    } else if (!pending) {
      pending = true;
      requestAnimationFrame(function () {
        pending = false;
        settle();
      });
    }
  }
  new MutationObserver(schedule).observe(root, { childList: true, subtree: true });
  window.addEventListener("resize", schedule);
  if (loaded) {
    schedule();
  } else {
    window.addEventListener("load", function () {
      loaded = true;
      schedule();
    });
  }
})();
