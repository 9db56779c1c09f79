/* The course website's own script (loaded on every page by _ext/course_site.py, before the search code). */

// Search: the lesson that teaches a term ranks above the glossary and the exercise pages that mention it.
var Scorer = {
  score: function (result) {
    var docname = result[0], score = result[4];
    if (/^chapters\/\d\d/.test(docname)) return score + 100;  // above a glossary index entry (100)
    if (/^(exercises\/|chapters\/glossary)/.test(docname)) return score - 10;
    return score;
  },
  objNameMatch: 11, objPartialMatch: 6, objPrio: {0: 15, 1: 5, 2: -5}, objPrioDefault: 0,
  title: 15, partialTitle: 7, term: 5, partialTerm: 2,
};

// Accessibility fixes for the theme's own markup (pydata-sphinx-theme 0.15, sphinx-book-theme 1.1).
document.addEventListener("DOMContentLoaded", function () {
  // The search button's aria-label ("Search") hides its visible text ("Search... Ctrl+K"): let the text name it.
  document.querySelectorAll(".search-button-field[aria-label]").forEach(function (button) {
    button.removeAttribute("aria-label");
  });
  // The primary sidebar (logo and book contents) is a landmark of its own, so the logo is inside one.
  document.querySelectorAll(".bd-sidebar-primary").forEach(function (sidebar) {
    if (!sidebar.hasAttribute("role")) {
      sidebar.setAttribute("role", "complementary");
      sidebar.setAttribute("aria-label", "Book contents");
    }
  });
});

// A display equation, an output or a table too wide for the column scrolls inside its own box; a box that scrolls must be
// reachable from the keyboard (WCAG 2.1.1), so those, and only those, join the tab order.
function courseFocusableScrollers() {
  document.querySelectorAll('main mjx-container[display="true"], main .cell_output, main .pst-scrollable-table-container').forEach(function (box) {
    var scrolls = box.scrollWidth > box.clientWidth + 1;
    if (scrolls && !box.hasAttribute("tabindex")) {
      box.setAttribute("tabindex", "0");
      box.dataset.courseScroller = "1";
    } else if (!scrolls && box.dataset.courseScroller) {
      box.removeAttribute("tabindex");
      delete box.dataset.courseScroller;
    }
  });
}
document.addEventListener("DOMContentLoaded", function () {
  courseFocusableScrollers();
  if (window.MathJax && MathJax.startup && MathJax.startup.promise) {
    MathJax.startup.promise.then(courseFocusableScrollers);
  }
  window.addEventListener("resize", courseFocusableScrollers);
});
